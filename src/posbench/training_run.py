"""One training run's state and how it is built: ``Progress`` (what the loop accumulates, saved whole in last.pt),
``Run`` (what the steps of ``train.train_loop`` share), ``prepare`` (builds them, resuming from last.pt), and
how they are saved: the best weights in checkpoint.pt, the state to resume from in last.pt.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from tqdm import tqdm

from . import distributed
from .checkpoint import save_checkpoint
from .copyseq import copy_symbols
from .costs import warn_randomized_positions
from .data import Corpus, load_corpus
from .errors import PosbenchError
from .io import write_csv
from .lengths import batch_rows, step_lengths_of
from .logger import Logger, open_logger
from .model import LanguageModel
from .optim import make_optimizer, make_scheduler
from .probes.suite import check_probe_data
from .resume import restore, resume_source, resume_state
from .runfolder import CHECKPOINT, RESUME_CHECKPOINT, TRAIN_LOG, legacy_run_id, new_run_id
from .runtime import resolve_device, resolve_precision, seed_everything
from .tasks import Task, build_task

log = logging.getLogger(__name__)

#: Spike detection compares each step with a running average over about the last 1 / (1 - decay) steps.
SPIKE_AVERAGE_DECAY = 0.9
# A loss spike must also rise this far above its average: near a solved task's zero loss every wobble is
# "above 1.5 times the average", and a flood of such warnings hides the real ones.
LOSS_SPIKE_MIN_RISE = 0.1


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
        loss_spike = self.loss_average is not None and train_loss > max(
            t.loss_spike_ratio * self.loss_average, self.loss_average + LOSS_SPIKE_MIN_RISE
        )
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
    copy_symbols: Tensor | None  # the words copy spans draw from (``train.copy_vocab``); None for a task run
    last_log_time: float = field(default_factory=time.perf_counter)

    @property
    def vocab(self) -> list[str]:
        return self.task.vocab if self.task else self.corpus.vocab


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
    symbols = None
    if corpus:
        check_splits(corpus, cfg, validates=world.is_main)  # before building anything; it draws no random numbers
        check_probe_data(corpus, cfg, device)  # a probe's bound on the data fails now, not after training
        symbols = copy_symbols(corpus.splits["train"], corpus.vocab_size, cfg.train.copy_vocab)
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
    rows = {length: world.batch_slice(batch_rows(cfg, length)) for length in step_lengths_of(cfg)}
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
        *(logger, bar, symbols),
    )


def save_best(run: Run, weights: dict, final: bool) -> None:
    """checkpoint.pt: the best weights so far, their step and run, and whether training has ended."""
    p = run.progress
    best = {"model": weights, "config": OmegaConf.to_container(run.cfg, resolve=True), "vocab": run.vocab}
    # precision: what ``auto`` resolved to on this machine, which a relaunch elsewhere is compared with
    best.update(step=p.best_step, valid_loss=p.best_val, run_id=p.run_id, final=final, precision=run.model.precision)
    save_checkpoint(run.run_dir / CHECKPOINT, best)


# Everything needed to continue exactly here goes to last.pt (rank 0 writes).
def save_resume_state(run: Run) -> None:
    if not run.world.is_main:
        return
    p = run.progress
    state = resume_state(run.model, run.optimizer, run.scheduler, run.gen, vars(p), run.cfg, run.vocab)
    save_checkpoint(run.run_dir / RESUME_CHECKPOINT, state)
    write_csv(pd.DataFrame(p.log_rows), run.run_dir / TRAIN_LOG)
