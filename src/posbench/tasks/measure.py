"""Training batches, validation and task_results.csv: a task's sequences drawn and scored.

* Randomness: NumPy generators keyed apart from any seeded with a training seed alone: training's by
  (``TRAIN_STREAM``, seed, step), so a resumed run redoes the same batches; validation's (``VALID_STREAM``)
  and evaluation's (``EVAL_STREAM``, eval_len, distance) by the geometry alone, so every model of a task
  is measured on the same sequences.
* Validation: ``VALID_TRIALS`` sequences at train_len, at distances drawn as training draws them; its answer
  NLL picks the best model, its accuracy says whether the task was learned (``LEARNED_ACCURACY``).
* task_results.csv: one row per (eval_len, distance), eval_lens and train_len; ``trials`` sequences each.
  ``accuracy``: the share of sequences whose whole answer is the model's top-1 prediction;
  ``token_accuracy``: the share of answer tokens; ``nll``: the mean NLL of the answer tokens. Status
  ``unsupported`` where the encoding cannot serve the length, ``not_learned`` on every row of a model
  below ``LEARNED_ACCURACY`` at train_len (its numbers kept).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..evaluate import variant_of
from ..lengths import eval_lens_of, train_lengths_label
from ..runtime import autocast
from ..variant import AttentionVariant
from .base import Batch, Task

log = logging.getLogger(__name__)

TRAIN_STREAM, VALID_STREAM, EVAL_STREAM = 0x7A51, 0x7A52, 0x7A53
VALID_TRIALS = 256
#: Accuracy at train_len (on the validation sequences) below which a run has not learned its task.
LEARNED_ACCURACY = 0.95

LogitsFn = Callable[[Tensor, int], Tensor]  # (inputs (B, T), last) -> logits (B, last, V)


def training_sequences(task: Task, seed: int, step: int, length: int, n: int) -> tuple[Tensor, Tensor]:
    """The ``n`` training sequences of ``step`` at ``length``: inputs and targets, the targets outside the
    loss (``task.loss=answer``: all but the answer's) set to IGNORE."""
    batch = task.batch(np.random.default_rng([TRAIN_STREAM, seed, step]), length, n)
    return batch.x, batch.answer_targets() if task.cfg.loss == "answer" else batch.y


def validation_sequences(task: Task, train_len: int) -> Batch:
    return task.batch(np.random.default_rng([VALID_STREAM]), train_len, VALID_TRIALS)


def model_logits(model: nn.Module) -> LogitsFn:
    """Logits of the last ``last`` positions, computed as ``token_nll`` computes them (the model's precision)."""

    def logits(idx: Tensor, last: int) -> Tensor:
        with autocast(idx.device, model.precision):
            return model.head(model(idx)[:, -last:])

    return logits


@dataclass
class TaskScore:
    trials: int
    accuracy: float
    token_accuracy: float
    nll: float


@torch.no_grad()
def score_task(logits_fn: LogitsFn, batch: Batch, batch_tokens: int, device) -> TaskScore:
    """The answers of ``batch`` scored: exact match of each whole answer, per-token accuracy, mean NLL."""
    last = len(batch.answer) - int(batch.answer.nonzero()[0])  # the answer's targets are the last ones
    answer = batch.answer[-last:]
    per_batch = max(1, batch_tokens // batch.x.shape[1])
    nll, hit = [], []
    for x, y in zip(batch.x.split(per_batch), batch.y.split(per_batch)):
        logits = logits_fn(x.to(device), last).float()[:, answer]  # (B, answer tokens, V)
        targets = y[:, -last:][:, answer].to(device)
        nll.append(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").cpu())
        hit.append((logits.argmax(-1) == targets).cpu())
    hits = torch.cat(hit)  # (trials, answer tokens)
    nlls = torch.cat(nll).double()
    return TaskScore(len(hits), hits.all(1).double().mean().item(), hits.double().mean().item(), nlls.mean().item())


def validation_score(model: nn.Module, task: Task, train_len: int, batch_tokens: int, device) -> TaskScore:
    """A task model scored on the task's validation sequences at train_len: training's validation of a task run."""
    model.eval()
    return score_task(model_logits(model), validation_sequences(task, train_len), batch_tokens, device)


def eval_distances(task: Task, given, train_len: int, length: int) -> list[int]:
    """The distances measured at ``length``: ``given`` (``task.distances``), or by default 0, train_len x 1/4 ..
    16 and the longest ``length`` holds; either way only those it holds."""
    longest = task.max_distance(length)
    if given is not None:
        return sorted({d for d in given if d <= longest})
    fractions = (0.25, 0.5, 1, 2, 4, 8, 16)
    return sorted({0, longest, *(int(train_len * f) for f in fractions if train_len * f <= longest)})


def task_lengths(cfg) -> list[int]:
    """The lengths a task run is measured at: eval_lens, and train_len (where learning is judged)."""
    return sorted({cfg.train_len, *eval_lens_of(cfg)})


def measure_task(model: nn.Module, task: Task, cfg, device, logits_fn: LogitsFn | None = None) -> pd.DataFrame:
    """The rows of task_results.csv without the run's state and steps: every (eval_len, distance) of
    ``task_lengths``, in the evaluation-time variant of ``eval.*`` (``Attention.evaluated_as``)."""
    model.eval()
    e, logits_fn = cfg.eval, logits_fn or model_logits(model)
    identity = dict(
        encoding=cfg.encoding.name,
        variant=variant_of(cfg.encoding, e, cfg.model),
        task=task.cfg.name,
        train_len=cfg.train_len,
        train_lengths=train_lengths_label(cfg),
        seed=cfg.seed,
    )
    rows = []
    with model.attention.evaluated_as(AttentionVariant.of(e, cfg.model)):
        for length in task_lengths(cfg):
            reason = model.encoding.unsupported_reason(length)
            for distance in eval_distances(task, task.cfg.distances, cfg.train_len, length):
                where = dict(identity, eval_len=length, distance=distance, trials=task.cfg.trials)
                if reason:
                    rows.append(dict(where, status="unsupported", reason=reason))
                    continue
                rng = np.random.default_rng([EVAL_STREAM, length, distance])
                batch = task.sequences(rng, length, np.full(task.cfg.trials, distance))
                score = score_task(logits_fn, batch, e.batch_tokens, device)
                rows.append(dict(where, **vars(score), status="ok", reason=""))
            shown = ", ".join(
                f"{r['distance']}: {r.get('accuracy', float('nan')):.2f}" for r in rows if r["eval_len"] == length
            )
            log.info("task %s at %d, accuracy by distance: %s", task.cfg.name, length, shown)
    return pd.DataFrame(rows)


def measured(model: nn.Module, task: Task, cfg, device, as_trained: nn.Module | None = None) -> pd.DataFrame:
    """task_results.csv's rows of ``model`` (``measure_task``), judged by the accuracy of the model as trained
    (``as_trained``, or ``model`` itself; without the evaluation-time variant) on the validation sequences at
    train_len: a variant that breaks the model at train_len shows in its rows there, not as "not learned"."""
    judge = as_trained if as_trained is not None else model
    judge.eval()
    batch = validation_sequences(task, cfg.train_len)
    learned = score_task(model_logits(judge), batch, cfg.eval.batch_tokens, device)
    model.eval()
    return judged(measure_task(model, task, cfg, device), learned.accuracy, cfg.train_len)


def judged(rows: pd.DataFrame, valid_accuracy: float, train_len: int) -> pd.DataFrame:
    """``rows`` with ``valid_accuracy``, and every row ``not_learned`` if it is below LEARNED_ACCURACY."""
    rows = rows.assign(valid_accuracy=valid_accuracy)
    if valid_accuracy >= LEARNED_ACCURACY:
        return rows
    reason = (
        f"accuracy {valid_accuracy:.3f} at train_len {train_len}, below {LEARNED_ACCURACY}: the task is not learned"
    )
    return rows.assign(status="not_learned", reason=reason)
