"""``posbench train``: train one LM, keep the best checkpoint, write perplexity at every eval length.

``train_loop`` is the loop, in named steps: ``training_batch`` (at this step's length),
``train_step`` (one optimizer step on the global batch), ``validate`` (rank 0 measures and keeps the
best model), ``stop_now`` (patience), ``log_row`` (train_log.csv, the logger, the progress bar) and
``save_resume_state`` (last.pt). What resuming means is resume.py's; the device, threads and RNG
state are runtime.py's. With ``task=...`` the run trains on a synthetic task instead of text (tasks/):
its batches, validation and final measurement (task_results.csv) are the task's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm import tqdm

from . import distributed
from .checkpoint import save_checkpoint
from .config import check_config, train_lengths_of, val_lens_of
from .copyseq import with_copies
from .costs import warn_randomized_positions
from .data import Corpus, load_corpus
from .errors import Interrupted, PosbenchError
from .evaluate import evaluate_lengths, not_measurable, score_nonoverlapping
from .io import write_csv
from .logger import Logger, open_logger
from .model import LanguageModel
from .optim import make_optimizer, make_scheduler
from .probes.suite import check_probe_data, run_probes
from .resume import finished_run, restore, resume_source, resume_state, start_afresh
from .runfolder import (
    CHECKPOINT,
    RESULTS,
    RESUME_CHECKPOINT,
    TASK_RESULTS,
    TRAIN_LOG,
    ModelState,
    check_mergeable,
    clear_error,
    errors_recorded,
    finalize,
    legacy_run_id,
    lock_run_dir,
    merge_rows,
    new_run_id,
    save_run_config,
)
from .runtime import freed_memory_kept, resolve_device, resolve_precision, seed_everything, set_threads
from .tasks import Task, build_task
from .tasks.base import IGNORE
from .tasks.measure import (
    LEARNED_ACCURACY,
    TaskScore,
    measured,
    model_logits,
    score_task,
    training_sequences,
    validation_sequences,
)

log = logging.getLogger(__name__)

#: Spike detection compares each step with a running average over about the last 1 / (1 - decay) steps.
SPIKE_AVERAGE_DECAY = 0.9
#: Keys the NumPy generator of each step's length under ``train.length_order=random`` (with seed, step).
TRAIN_LENGTH_STREAM = 0x1E46


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """``batch_size`` random windows of ``seq_len`` inputs and their next-token targets."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([tokens[s : s + seq_len] for s in starts])
    y = torch.stack([tokens[s + 1 : s + seq_len + 1] for s in starts])
    return x, y


@dataclass
class Progress:
    """What the loop accumulates; saved whole in last.pt."""

    step: int = 0
    tokens_seen: int = 0
    best_val: float = math.inf
    best_step: int = 0
    best_model: dict | None = None
    checks_since_best: int = 0  # validations without a new best (train.patience)
    out_of_patience: bool = False  # saved, so that a run resumed after its stop stays stopped
    log_rows: list[dict] = field(default_factory=list)
    loss_average: float | None = None
    grad_average: float | None = None
    run_id: str = field(default_factory=new_run_id)  # which run the rows of this folder's CSVs measured
    valid_accuracy: float | None = None  # a task run's answer accuracy at the last validation
    learned_step: int | None = None  # the first validation at which it reached LEARNED_ACCURACY

    def spikes(self, step: int, train_loss: float, grad: float, t) -> tuple[bool, bool]:
        """Whether this step's loss and gradient norm jumped above their running averages (logged
        as a warning), then fold them into the averages."""
        loss_spike = self.loss_average is not None and train_loss > t.loss_spike_ratio * self.loss_average
        grad_spike = self.grad_average is not None and grad > t.grad_spike_ratio * self.grad_average
        if loss_spike or grad_spike:
            log.warning(
                "step %d: spike: train loss %.3f (average %.3f), gradient norm %.3g (average %.3g)",
                *(step, train_loss, self.loss_average, grad, self.grad_average),
            )
        self.loss_average = running_average(self.loss_average, train_loss)
        self.grad_average = running_average(self.grad_average, grad)
        return loss_spike, grad_spike


def running_average(average: float | None, value: float) -> float:
    return value if average is None else SPIKE_AVERAGE_DECAY * average + (1 - SPIKE_AVERAGE_DECAY) * value


@dataclass
class Run:
    """What the steps of one training run share."""

    cfg: DictConfig
    run_dir: Path
    world: distributed.World
    device: torch.device
    corpus: Corpus | None  # None for a task run
    task: Task | None  # the synthetic task trained on instead of text (``task=...``)
    model: LanguageModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    gen: torch.Generator  # draws the training batches; its state is saved with the others
    progress: Progress
    loss_fn: nn.Module  # (x, y) -> (B, T) NLL; under DDP when there are several ranks
    rows: dict[int, slice]  # this rank's rows of the global batch, by sequence length
    logger: Logger
    bar: tqdm  # on a terminal, rank 0 only
    last_log_time: float = field(default_factory=time.perf_counter)

    @property
    def vocab(self) -> list[str]:
        return self.task.vocab if self.task else self.corpus.vocab


def step_length(cfg: DictConfig, step: int) -> int:
    """The sequence length of ``step`` (from 1): train_len, or one of ``train.lengths`` by ``train.length_order``."""
    lengths = train_lengths_of(cfg)
    if cfg.train.length_order == "curriculum":  # Shortformer's stages: equal shares of the steps, shortest first
        return lengths[(step - 1) * len(lengths) // cfg.train.steps]
    # drawn from (seed, step) alone, not a running generator: a resumed run redoes the same lengths
    return lengths[np.random.default_rng([TRAIN_LENGTH_STREAM, cfg.seed, step]).integers(len(lengths))]


def counts_for_patience(cfg: DictConfig, step: int) -> bool:
    """Whether a validation at ``step`` counts toward train.patience: always, except in a curriculum's shorter
    stages, where the loss at train_len may stall and would stop the run before it ever trains at train_len."""
    return cfg.train.length_order != "curriculum" or step_length(cfg, step) == cfg.train_len


def batch_rows(cfg: DictConfig, length: int) -> int:
    """Sequences per step at ``length``: whatever the length, a step holds train.batch_size x train_len tokens."""
    return cfg.train.batch_size * cfg.train_len // length


def training_batch(run: Run, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: random windows of the train split at ``step_length``, ``train.copy_fraction``
    of them replaced by synthetic copy sequences (drawn apart from ``run.gen``, so the windows stay the same);
    with a task, its sequences of ``step``."""
    cfg, length = run.cfg, step_length(run.cfg, step)
    if run.task:
        return training_sequences(run.task, cfg.seed, step, length, batch_rows(cfg, length))
    train_split = run.corpus.splits["train"]
    x, y = sample_batch(train_split, batch_rows(cfg, length), length, run.gen)
    if not cfg.train.copy_fraction:
        return x, y
    return with_copies(
        x, y, train_split, run.corpus.vocab_size, cfg.train.copy_fraction, cfg.probe.span, cfg.seed, step
    )


def check_splits(corpus, cfg: DictConfig, validates: bool = True) -> None:
    """A train split too short for one sequence stops the run; a valid split shorter than one window is
    validated in one shorter window, which the rank that ``validates`` says once, as the best checkpoint
    and patience rest on it."""
    t = cfg.train
    if len(corpus.splits["train"]) <= cfg.train_len + 1:
        longest = f"train.lengths={list(t.lengths)}" if t.lengths is not None else f"train_len={cfg.train_len}"
        raise PosbenchError(f"the train split has {len(corpus.splits['train'])} tokens, too few for {longest}")
    targets = len(corpus.splits["valid"][: t.val_tokens]) - 1
    if targets < cfg.train_len and validates:
        log.warning(
            "the valid split has %d targets (train.val_tokens=%s), fewer than one window of train_len=%d: "
            "validation (the best checkpoint, patience) scores them in one shorter window",
            *(targets, t.val_tokens, cfg.train_len),
        )


def prepare(cfg: DictConfig, run_dir: Path, world: distributed.World) -> Run:
    """Build the model, optimizer and data, then put last.pt's state in place when resuming.

    The order is fixed: seeded draws (weight init, the batch generator) depend on it.
    """
    device = world.device(resolve_device(cfg.device))
    seed_everything(cfg.seed)
    task, corpus = (build_task(cfg.task), None) if cfg.task else (None, load_corpus(cfg.data))
    if corpus:
        check_splits(corpus, cfg, validates=world.is_main)  # before building anything; it draws no random numbers
        check_probe_data(corpus, cfg, device)  # a probe's bound on the data fails now, not after training
    warn_randomized_positions(cfg)
    precision, why = resolve_precision(cfg.precision, device)
    vocab = task.vocab if task else corpus.vocab
    model = LanguageModel(cfg.model, cfg.encoding, len(vocab), cfg.train_len, precision).to(device)
    log.info(
        "model: %s params, encoding %s, device %s, %s (%s), %d rank(s), torch threads %d",
        *(f"{model.num_params():,}", cfg.encoding.name, device, precision, why, world.size, torch.get_num_threads()),
    )
    t = cfg.train
    optimizer = make_optimizer(model, t)
    scheduler = make_scheduler(optimizer, t)
    gen = torch.Generator().manual_seed(cfg.seed)
    source = resume_source(cfg, run_dir)
    progress = Progress()
    if source:
        restored = restore(source, model, optimizer, scheduler, gen, cfg, vocab)
        progress = Progress(**{"run_id": legacy_run_id(run_dir), **restored})  # a last.pt from before run ids
        log.info("resumed from %s at step %d of %d", source, progress.step, t.steps)
    loss_fn = distributed.training_loss(model, world, device)
    rows = {length: world.batch_slice(batch_rows(cfg, length)) for length in train_lengths_of(cfg)}
    logger = open_logger(cfg.logger, run_dir, world.is_main)
    bar = tqdm(
        total=t.steps,
        initial=progress.step,
        desc=f"train {cfg.encoding.name}",
        disable=not (sys.stderr.isatty() and world.is_main),
        dynamic_ncols=True,
    )
    return Run(
        *(cfg, run_dir, world, device, corpus, task, model, optimizer, scheduler, gen, progress, loss_fn, rows),
        *(logger, bar),
    )


# One optimizer step on the global batch (x, y); each rank computes the loss of its own rows.
def train_step(run: Run, x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[float, float]:
    """Returns the whole batch's training loss and the gradient norm (before clipping)."""
    run.model.train()
    rows = run.rows[x.shape[1]]
    nll = run.loss_fn(x[rows].to(run.device), y[rows].to(run.device))  # (B, T)
    # targets outside a task's loss are IGNORE, with NLL 0: the mean is over the others
    loss = nll.mean() if run.task is None else nll.sum() / (y[rows] != IGNORE).sum().to(run.device)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.train.grad_clip)
    train_loss, grad = run.world.mean(loss), grad_norm.item()  # DDP already averaged the gradients
    for what, value in (("training loss", train_loss), ("gradient norm", grad)):
        if not math.isfinite(value):
            stop_non_finite(run, what, value, step)
    run.optimizer.step()
    run.scheduler.step()
    return train_loss, grad


# Rank 0 measures the validation loss and keeps the best model so far in checkpoint.pt; returns it and the
# losses at train.val_lens as train_log.csv's columns (valid_loss, valid_loss_L).
def validate(run: Run, step: int) -> dict[str, float]:
    cfg, progress = run.cfg, run.progress
    if run.task:  # the answer's NLL and accuracy on the task's validation sequences at train_len
        score = validation_score(run)
        val_loss, progress.valid_accuracy = score.nll, score.accuracy
        if progress.learned_step is None and score.accuracy >= LEARNED_ACCURACY:
            progress.learned_step = step
    else:
        valid_tokens = run.corpus.splits["valid"][: cfg.train.val_tokens]
        val_loss = score_nonoverlapping(run.model, valid_tokens, cfg.train_len, cfg.eval.batch_tokens, run.device).nll
    if not math.isfinite(val_loss):
        stop_non_finite(run, "validation loss", val_loss, step)
    progress.checks_since_best += counts_for_patience(cfg, step)
    if val_loss < progress.best_val:
        progress.best_val, progress.best_step, progress.checks_since_best = val_loss, step, 0
        progress.best_model = copy.deepcopy(run.model.state_dict())
        save_best(run, run.model.state_dict(), final=False)
    return {"valid_loss": val_loss, **losses_at_val_lens(run, val_loss)}


def losses_at_val_lens(run: Run, val_loss: float) -> dict[str, float]:
    """``valid_loss_L`` for each L of train.val_lens: train_len's is ``val_loss``; every other length reads at
    least one window of the valid split, whatever train.val_tokens caps; one that the encoding cannot serve
    or the split cannot fill is NaN (said once). They pick no checkpoint and count for no patience."""
    cfg, losses = run.cfg, {}
    for length in val_lens_of(cfg):
        cap = cfg.train.val_tokens
        tokens = run.corpus.splits["valid"][: None if cap is None else max(cap, length + 1)]
        status, reason = not_measurable(run.model, tokens, "valid", length, None)
        if status:
            warn_once(f"train.val_lens: valid_loss_{length} is NaN: {reason}")
            losses[f"valid_loss_{length}"] = math.nan
        elif length == cfg.train_len:
            losses[f"valid_loss_{length}"] = val_loss
        else:
            score = score_nonoverlapping(run.model, tokens, length, cfg.eval.batch_tokens, run.device)
            losses[f"valid_loss_{length}"] = score.nll
    return losses


@functools.cache
def warn_once(message: str) -> None:
    log.warning(message)


def validation_score(run: Run) -> TaskScore:
    """A task run's model scored on the task's validation sequences at train_len."""
    run.model.eval()
    batch = validation_sequences(run.task, run.cfg.train_len)
    return score_task(model_logits(run.model), batch, run.cfg.eval.batch_tokens, run.device)


def save_best(run: Run, weights: dict, final: bool) -> None:
    """checkpoint.pt: the best weights so far, their step and run, and whether training has ended."""
    p = run.progress
    best = {"model": weights, "config": OmegaConf.to_container(run.cfg, resolve=True), "vocab": run.vocab}
    best.update(step=p.best_step, valid_loss=p.best_val, run_id=p.run_id, final=final)
    save_checkpoint(run.run_dir / CHECKPOINT, best)


# Early stopping before train.steps: rank 0 (which alone validates) decides after each validation, every rank follows.
def stop_now(run: Run, step: int) -> bool:
    p, patience = run.progress, run.cfg.train.patience
    p.out_of_patience = distributed.broadcast(patience is not None and p.checks_since_best >= patience, run.world)
    if p.out_of_patience:
        log.info(
            "step %d: no better validation loss in %d checks (train.patience); stopping, best %.3f at step %d",
            *(step, patience, p.best_val, p.best_step),
        )
    return p.out_of_patience


# One train_log.csv row, also handed to the logger (TensorBoard) and shown on the progress bar; ``losses``:
# what ``validate`` measured at this step, if it did.
def log_row(run: Run, step: int, train_loss: float, grad: float, losses: dict | None, spikes: tuple[bool, bool]):
    t = run.cfg.train
    now = time.perf_counter()
    steps_since = step % t.log_every or t.log_every
    tok_s = steps_since * t.batch_size * run.cfg.train_len / max(now - run.last_log_time, 1e-9)
    run.last_log_time = now
    row = dict(step=step, seq_len=step_length(run.cfg, step), tokens=run.progress.tokens_seen, train_loss=train_loss)
    row.update(lr=run.scheduler.get_last_lr()[0])
    row.update(grad_norm=grad, valid_loss=None, **{f"valid_loss_{n}": None for n in val_lens_of(run.cfg)})
    row.update(losses or {})
    row.update(tokens_per_s=tok_s, loss_spike=spikes[0], grad_spike=spikes[1])
    val_loss = row["valid_loss"]
    if run.task:  # its learning curve
        row.update(valid_accuracy=run.progress.valid_accuracy if val_loss is not None else None)
    run.progress.log_rows.append(row)
    run.logger.log_step(row)
    run.bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tok_s:,.0f}")
    if val_loss is not None:
        log.info("step %d: train %.3f valid %.3f (best %.3f)", step, train_loss, val_loss, run.progress.best_val)


# Everything needed to continue exactly here goes to last.pt (rank 0 writes).
def save_resume_state(run: Run) -> None:
    if not run.world.is_main:
        return
    p = run.progress
    state = resume_state(run.model, run.optimizer, run.scheduler, run.gen, vars(p), run.cfg, run.vocab)
    save_checkpoint(run.run_dir / RESUME_CHECKPOINT, state)
    write_csv(pd.DataFrame(p.log_rows), run.run_dir / TRAIN_LOG)


def stop_non_finite(run: Run, what: str, value: float, step: int) -> None:
    """Log the step that went non-finite and stop; the best checkpoint and the last resume state stay."""
    p = run.progress
    p.log_rows.append(dict(step=step, tokens=p.tokens_seen, train_loss=value if what == "training loss" else None))
    if run.world.is_main:
        write_csv(pd.DataFrame(p.log_rows), run.run_dir / TRAIN_LOG)
    kept = f"{CHECKPOINT} (best, step {p.best_step})" if p.best_step else "no checkpoint yet"
    raise PosbenchError(
        f"{what} is {value} at step {step}; training stopped, {kept} kept; "
        "try a lower train.lr, more train.warmup_steps or a smaller train.grad_clip"
    )


def stopped(run: Run, signal_name: str, step: int) -> Interrupted:
    return Interrupted(
        f"stopped by {signal_name} at step {step} of {run.cfg.train.steps}; the state is saved in "
        f"{run.run_dir / RESUME_CHECKPOINT}; to continue, run the same command in the same folder "
        f"(hydra.run.dir='{run.run_dir}', or a sweep's hydra.sweep.dir)"
    )


# The best model's perplexity at every eval length goes to results.csv, rows measured on earlier weights of
# this run go; then last.pt is no longer needed.
def finish(run: Run) -> dict:
    p = run.progress
    write_csv(pd.DataFrame(p.log_rows), run.run_dir / TRAIN_LOG)
    run.model.load_state_dict(p.best_model)
    save_best(run, p.best_model, final=True)
    state = ModelState(p.run_id, p.best_step, final=True)
    stopped = dict(stopped_step=p.step, best_step=p.best_step, stop_reason="patience" if p.out_of_patience else "steps")
    if run.task:
        results = measure(run).assign(**stopped)
        merge_rows(run.run_dir, TASK_RESULTS, results, state)
    else:
        results = evaluate_lengths(run.model, run.corpus, run.cfg, run.device, run.run_dir, state).assign(**stopped)
        merge_rows(run.run_dir, RESULTS, results, state)
        run.logger.log_results(results)
        run_probes(run.model, run.corpus, run.cfg, run.device, run.run_dir, state)  # those of ``probes=[...]``
    finalize(run.run_dir, state)
    run.logger.close()
    (run.run_dir / RESUME_CHECKPOINT).unlink(missing_ok=True)  # finished: results.csv and checkpoint.pt say all
    return {"best_valid_loss": p.best_val, "results": results}


def measure(run: Run) -> pd.DataFrame:
    """A task run's task_results.csv rows: the best model at every (eval_len, distance), every row
    ``not_learned`` if its validation accuracy at train_len (as trained, no evaluation-time variant) is too low."""
    rows = measured(run.model, run.task, run.cfg, run.device)
    return rows.assign(learned_step=run.progress.learned_step, params=run.model.num_params())


@contextlib.contextmanager
def signals_deferred():
    """SIGINT/SIGTERM only set a flag (the loop checkpoints, then stops); a second one stops at once."""
    caught: list[str] = []

    def handler(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield caught
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(cfg: DictConfig, run_dir: Path, checked: bool = False) -> dict:
    """Train (or resume), keep the best model by validation loss, evaluate it; returns the final metrics.

    ``checked``: ``check_config`` has run on ``cfg`` (``posbench train`` runs it on every job before the first
    starts, and passes True); a direct call leaves it False, and the config is checked here, once."""
    if not checked:
        check_config(cfg)
    world = distributed.setup()  # one process alone, or this rank's place under torchrun / SLURM
    set_threads(cfg.threads)
    run_dir = Path(run_dir)
    writes = run_dir if world.is_main else None  # rank 0 alone writes
    with lock_run_dir(run_dir) if writes else contextlib.nullcontext(), errors_recorded(writes):
        done = finished_run(cfg, run_dir)
        if done is not None:
            log.info("%s already holds this run, finished (train.resume=false runs it again)", run_dir)
            return done
        if writes and str(cfg.train.resume).lower() == "false":
            start_afresh(run_dir)
        if writes:
            check_mergeable(run_dir)  # a results file that cannot take rows fails now, not after training
        run = prepare(cfg, run_dir, world)
        if writes:
            clear_error(run_dir)  # the folder is taken: an earlier failure's account is past
            save_run_config(run_dir, run.progress.run_id, OmegaConf.to_container(cfg, resolve=True))
        train_loop(run)
        run.bar.close()
        return finish(run) if world.is_main else {}


def train_loop(run: Run) -> None:
    """From where ``run.progress`` stands to train.steps, or until patience runs out; last.pt saved on the way."""
    t, progress = run.cfg.train, run.progress
    last = progress.step if progress.out_of_patience else t.steps  # resumed after an early stop: nothing left
    with signals_deferred() as caught, freed_memory_kept():
        for step in range(progress.step + 1, last + 1):
            x, y = training_batch(run, step)
            train_loss, grad = train_step(run, x, y, step)
            run.bar.update()
            progress.step, progress.tokens_seen = step, progress.tokens_seen + x.numel()
            spikes = progress.spikes(step, train_loss, grad, t)
            val_loss, validating = None, step % t.eval_every == 0 or step == t.steps
            if validating and run.world.is_main:  # the other ranks wait
                val_loss = validate(run, step)
            if step % t.log_every == 0 or val_loss is not None or any(spikes):
                log_row(run, step, train_loss, grad, val_loss, spikes)
            stopping = validating and step < t.steps and stop_now(run, step)
            if step % t.checkpoint_every == 0 or step == t.steps or caught or stopping:
                save_resume_state(run)
            if caught:
                raise stopped(run, caught[0], step)
            if stopping:
                return
