"""Training one LM: keep the best checkpoint, write perplexity at every eval length (``train``; the command
``posbench train`` is commands/train.py).

``train_loop`` is the loop, in named steps: ``training_batch`` (at this step's length),
``train_step`` (one optimizer step on the global batch), ``validate`` (rank 0 measures and keeps the
best model), ``stop_now`` (patience), ``log_row`` (train_log.csv, the logger, the progress bar) and
``save_resume_state`` (last.pt). What a run holds, and how it is built, is training_run.py's; which length
each step trains at is lengths.py's; what resuming means is resume.py's; the device, threads, RNG state and
signals are runtime.py's. With ``task=...`` the run trains on a synthetic task instead of text (tasks/):
its batches, validation and final measurement (task_results.csv) are the task's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from . import distributed
from .config import check_config
from .copyseq import with_copies
from .errors import Interrupted, PosbenchError
from .evaluate import evaluate_lengths, not_measurable, score_nonoverlapping
from .io import write_csv
from .lengths import batch_rows, counts_for_patience, step_length, val_lens_of
from .probes.suite import run_probes
from .resume import finished_run, start_afresh
from .runfolder import (
    CHECKPOINT,
    RESUME_CHECKPOINT,
    TASK_RESULTS,
    TRAIN_LOG,
    ModelState,
    check_mergeable,
    clear_error,
    errors_recorded,
    finalize,
    lock_run_dir,
    merge_rows,
    save_run_config,
)
from .runtime import freed_memory_kept, set_threads, signals_deferred
from .tasks.base import IGNORE
from .tasks.measure import LEARNED_ACCURACY, measured, training_sequences, validation_score
from .training_run import Run, prepare, save_best, save_resume_state

log = logging.getLogger(__name__)


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """``batch_size`` random windows of ``seq_len`` inputs and their next-token targets."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([tokens[s : s + seq_len] for s in starts])
    y = torch.stack([tokens[s + 1 : s + seq_len + 1] for s in starts])
    return x, y


def training_batch(run: Run, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: random windows of the train split at ``step_length``, ``train.copy_fraction``
    of them replaced by synthetic copy sequences (drawn apart from ``run.gen``, so the windows stay the same),
    all of them in the first ``train.copy_warmup_steps``; with a task, its sequences of ``step``."""
    cfg, length = run.cfg, step_length(run.cfg, step)
    if run.task:
        return training_sequences(run.task, cfg.seed, step, length, batch_rows(cfg, length))
    train_split = run.corpus.splits["train"]
    x, y = sample_batch(train_split, batch_rows(cfg, length), length, run.gen)
    if step <= cfg.train.copy_warmup_steps:  # copies alone, of train.copy_warmup_span (null: half the length)
        warmup_span = cfg.train.copy_warmup_span
        fraction, span = 1.0, length if warmup_span is None else warmup_span
    else:
        fraction, span = cfg.train.copy_fraction, cfg.probe.span
    if not fraction:
        return x, y
    return with_copies(x, y, train_split, run.copy_symbols, fraction, span, cfg.seed, step, cfg.train.copy_loss)


# One optimizer step on the global batch (x, y); each rank computes the loss of its own rows.
def train_step(run: Run, x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[float, float]:
    """Returns the whole batch's training loss and the gradient norm (before clipping)."""
    run.model.train()
    rows = run.rows[x.shape[1]]
    nll = run.loss_fn(x[rows].to(run.device), y[rows].to(run.device))  # (B, T)
    # targets outside the loss (a task's, train.copy_loss's) are IGNORE, with NLL 0: the mean is over the others
    counted = y[rows] != IGNORE
    loss = nll.mean() if counted.all() else nll.sum() / counted.sum().to(run.device)
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
        score = validation_score(run.model, run.task, cfg.train_len, cfg.eval.batch_tokens, run.device)
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


# The best model's perplexity at every eval length goes to results.csv, then its probes run, each length and
# probe kept as soon as it is measured (a finish resumed after a kill takes up where it was); rows measured on
# earlier weights of this run go; then last.pt is no longer needed.
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
        # keep_measured: what an interrupted attempt of this finish measured on these weights is not redone
        args = (run.model, run.corpus, run.cfg, run.device, run.run_dir, state)
        results = evaluate_lengths(*args, columns=stopped, keep_measured=True)
        run.logger.log_results(results)
        run_probes(*args, keep_measured=True)  # those of ``probes=[...]``
    finalize(run.run_dir, state)
    run.logger.close()
    (run.run_dir / RESUME_CHECKPOINT).unlink(missing_ok=True)  # finished: results.csv and checkpoint.pt say all
    return {"best_valid_loss": p.best_val, "results": results}


def measure(run: Run) -> pd.DataFrame:
    """A task run's task_results.csv rows: the best model at every (eval_len, distance), every row
    ``not_learned`` if its validation accuracy at train_len (as trained, no evaluation-time variant) is too low."""
    rows = measured(run.model, run.task, run.cfg, run.device)
    return rows.assign(learned_step=run.progress.learned_step, params=run.model.num_params())


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
