"""Context-usage curve: the mean NLL of fixed test targets against the left context k they see.

Protocol (``context_usage``):

* Contexts: ``contexts``, by default the powers of two from 16 to 16 x train_len, plus train_len.
  Contexts above half the stream are dropped with one warning, so that at least half of it can be targets.
* Targets: stream positions t (the token at t is predicted from those before it) with t >= K, the largest context. These
  positions are cut into runs of ``block`` consecutive ones; the runs are taken in an order drawn with
  ``seed`` until ``targets`` positions are chosen. The same targets are scored at every context.
* Windows: at context k, with m = max(1, k // 4), the sorted targets are grouped greedily: a window
  starts k tokens before its first target t0 and serves every target in [t0, t0 + m). It holds
  tokens[t0 - k : t_last], at most k + m - 1 tokens, and only its targets are kept, so every target sees
  between k and k + m - 1 <= 1.25 k tokens of left context. Where the encoding cannot serve k + m - 1
  positions, m is halved until it can; where it cannot serve k, the context is ``unsupported``.
* Cost: at k >= 4 x block each window serves one run, so targets / block windows of about k tokens;
  below that about 4 x targets / k windows of about 1.25 k tokens.
* Subsets, fixed per target from the left context it sees at K with the default m: ``repeat_near`` (its
  word occurs in the last train_len tokens), ``repeat_far`` (it occurs in that context, but not in its last
  train_len tokens), ``novel`` (it does not occur); ``all`` holds every target.
* Per context and subset: ``targets`` the number scored, ``nll`` their mean, ``nll_se`` its standard error
  (sample standard deviation, ddof=1, over sqrt(targets)), ``ppl`` = exp(nll). An ``unsupported`` context
  has targets 0 and no nll; a subset without targets has no nll.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ..errors import PosbenchError, raise_problems
from . import device_of, within_data

COLUMNS = ["split", "context", "subset", "targets", "nll", "nll_se", "ppl", "status", "reason"]
SUBSETS = ["all", "repeat_far", "repeat_near", "novel"]
#: effective_context: the smallest context whose nll is this close to the minimum (nats).
EFFECTIVE_TOLERANCE = 0.01


@dataclass
class ContextProbeConfig:
    #: Most targets scored (fewer where the stream has fewer eligible positions).
    targets: int = 4096
    #: Left-context sizes k (``null``: powers of two from 16 to 16 x train_len, plus train_len).
    contexts: Optional[List[int]] = None
    #: Seed of the choice of targets.
    seed: int = 0
    #: Targets come in runs of this many consecutive positions, so that long contexts share windows.
    block: int = 64

    def __post_init__(self):
        raise_problems(self.problems())  # ProblemsFound, a ValueError: every broken rule at once

    def problems(self) -> list[str]:
        counts = {"targets": self.targets, "block": self.block}
        found = [f"probe.{key}={value} must be at least 1" for key, value in counts.items() if value < 1]
        if self.contexts is not None and (not self.contexts or min(self.contexts) < 1):
            found.append(f"probe.contexts={list(self.contexts)} must be positive integers")
        return found


def default_contexts(train_len: int) -> list[int]:
    """Powers of two from 16 to 16 x train_len, and train_len itself (which ``gain_beyond`` needs)."""
    powers = [16 * 2**i for i in range(int(math.log2(train_len)) + 1) if 16 * 2**i <= 16 * train_len]
    return sorted(set(powers) | {train_len})


def choose_targets(n_tokens: int, first: int, count: int, block: int, seed: int) -> np.ndarray:
    """Sorted target positions in [first, n_tokens): runs of ``block`` positions in a seeded order, ``count`` in all."""
    starts = np.arange(first, n_tokens, block)
    order = np.random.default_rng(seed).permutation(len(starts))
    runs = [np.arange(s, min(s + block, n_tokens)) for s in starts[order]]
    chosen = np.concatenate(runs)[:count] if runs else np.zeros(0, dtype=np.int64)
    return np.sort(chosen)


def plan_windows(targets: np.ndarray, context: int, per_window: int) -> list[tuple[int, int, int]]:
    """(start, first, stop) per window: it starts ``context`` tokens before targets[first] and serves
    targets[first:stop], the sorted targets within ``per_window`` positions of targets[first]."""
    plan, first = [], 0
    while first < len(targets):
        stop = int(np.searchsorted(targets, targets[first] + per_window))
        plan.append((int(targets[first]) - context, first, stop))
        first = stop
    return plan


def per_window_for(context: int) -> int:
    """Targets per window at ``context``: m = max(1, k // 4), so no target sees more than 1.25 k tokens."""
    return max(1, context // 4)


def seen_contexts(targets: np.ndarray, plan: list[tuple[int, int, int]]) -> np.ndarray:
    """The left context each target sees under ``plan``, aligned with ``targets``."""
    seen = np.zeros(len(targets), dtype=np.int64)
    for start, first, stop in plan:
        seen[first:stop] = targets[first:stop] - start
    return seen


@torch.no_grad()
def score_at_context(
    model: nn.Module, tokens: Tensor, targets: np.ndarray, plan: list[tuple[int, int, int]], batch_tokens: int
) -> np.ndarray:
    """NLL (float64) of every target, aligned with ``targets``, each scored by its window of ``plan``."""
    nll = np.zeros(len(targets))
    by_length: dict[int, list[tuple[int, int, int]]] = {}  # windows of one length batch together
    for start, first, stop in plan:
        by_length.setdefault(int(targets[stop - 1]) - start, []).append((start, first, stop))
    device = device_of(model)
    for length, group in by_length.items():
        per_batch = max(1, batch_tokens // length)
        for i in range(0, len(group), per_batch):
            batch = group[i : i + per_batch]
            x = torch.stack([tokens[s : s + length] for s, _, _ in batch]).to(device)  # (B, length)
            y = torch.stack([tokens[s + 1 : s + length + 1] for s, _, _ in batch]).to(device)
            window_nll = model.token_nll(x, y).double().cpu().numpy()  # (B, length)
            for row, (start, first, stop) in enumerate(batch):
                nll[first:stop] = window_nll[row, targets[first:stop] - start - 1]  # column j predicts start + j + 1
    return nll


def previous_occurrence(tokens: np.ndarray) -> np.ndarray:
    """For every position, the last earlier position holding the same token (-1 where there is none)."""
    order = np.argsort(tokens, kind="stable")
    same = tokens[order[1:]] == tokens[order[:-1]]
    prev = np.full(len(tokens), -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    return prev


def target_subsets(tokens: np.ndarray, targets: np.ndarray, seen: np.ndarray, train_len: int) -> np.ndarray:
    """``repeat_near``, ``repeat_far`` or ``novel`` per target, given the left context ``seen`` it has."""
    distance = targets - previous_occurrence(tokens)[targets]  # > targets where the word never occurred
    near = np.minimum(seen, train_len)
    return np.where(distance <= near, "repeat_near", np.where(distance <= seen, "repeat_far", "novel"))


def summarize(nll: np.ndarray, subsets: np.ndarray) -> list[dict]:
    """One row per subset: targets, mean nll, its standard error and ppl."""
    rows = []
    for subset in SUBSETS:
        values = nll if subset == "all" else nll[subsets == subset]
        mean = float(values.mean()) if len(values) else math.nan
        se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
        rows.append(dict(subset=subset, targets=len(values), nll=mean, nll_se=se, ppl=math.exp(mean)))
    return rows


def served_per_window(model: nn.Module, context: int, train_len: int) -> tuple[int | None, str]:
    """(m, "") for the largest m <= max(1, k // 4), halving, whose windows (k + m - 1 tokens) the encoding can
    serve, or (None, why) where it cannot, or where beyond train_len the windows it can serve would cost more
    than train_len tokens per target (an encoding that serves k but hardly more: ~k forward tokens per target)."""
    per_window = per_window_for(context)
    while model.encoding.unsupported_reason(context + per_window - 1) is not None and per_window > 1:
        per_window //= 2
    reason = model.encoding.unsupported_reason(context + per_window - 1)
    if reason:
        return None, reason
    if context > train_len and context + per_window - 1 > per_window * train_len:
        served = context + per_window - 1
        return None, f"serves windows of {served} tokens, {per_window} target(s) each: too costly to probe"
    return per_window, ""


def context_usage(
    model: nn.Module,
    tokens: Tensor,
    train_len: int,
    cfg: ContextProbeConfig,
    batch_tokens: int,
    split: str = "test",
) -> pd.DataFrame:
    """The context-usage curve of ``model`` on ``tokens`` (1-D): one row per (context, subset); see the module."""
    model.eval()
    contexts = within_data(cfg.contexts or default_contexts(train_len), len(tokens) // 2, "probe.contexts")
    if not contexts:
        raise PosbenchError(
            f"the {split} split has {len(tokens)} tokens, too few for probe.contexts (k needs 2k tokens); lower them"
        )
    largest = contexts[-1]
    targets = choose_targets(len(tokens), largest, cfg.targets, cfg.block, cfg.seed)
    seen = seen_contexts(targets, plan_windows(targets, largest, per_window_for(largest)))
    subsets = target_subsets(tokens.cpu().numpy(), targets, seen, train_len)
    rows = []
    for context in contexts:
        where = dict(split=split, context=context)
        per_window, reason = served_per_window(model, context, train_len)
        if per_window is None:
            rows += [dict(where, subset=s, targets=0, status="unsupported", reason=reason) for s in SUBSETS]
            continue
        nll = score_at_context(model, tokens, targets, plan_windows(targets, context, per_window), batch_tokens)
        rows += [dict(where, **row, status="ok", reason="") for row in summarize(nll, subsets)]
    return pd.DataFrame(rows, columns=COLUMNS)


def curve(df: pd.DataFrame) -> pd.Series:
    """nll by context of one run's ``all`` targets (one split), over the contexts that were served."""
    ok = df[(df["subset"] == "all") & (df["status"] == "ok")]
    return ok.set_index("context")["nll"].sort_index()


def gain_beyond(df: pd.DataFrame, train_len: int) -> float:
    """nll(k = train_len) - nll(k = the largest served k), in nats (NaN when train_len was not served).

    Positive: the model uses context beyond its training length.
    """
    nll = curve(df)
    return float(nll[train_len] - nll.iloc[-1]) if train_len in nll.index else math.nan


def effective_context(df: pd.DataFrame) -> int:
    """The smallest context whose nll is within ``EFFECTIVE_TOLERANCE`` nats of the minimum over contexts."""
    nll = curve(df)
    return int(nll.index[nll <= nll.min() + EFFECTIVE_TOLERANCE][0])
