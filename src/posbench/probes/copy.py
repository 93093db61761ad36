"""Long-range copy: is a random span predicted better when the same span occurred d tokens earlier?

Protocol (``copy_probe``):

* Sequences: a span A of ``span`` tokens drawn uniformly from the vocabulary (``vocab``: from the training
  split's ``vocab`` most frequent words, those a copy-trained model's warm-up drew from), then d tokens of real text
  (a window of the stream at a random offset), then A again. Its baseline is the same sequence with the
  first A replaced by a different random span B. Both score the second A's tokens 2..span.
* Distances: ``distances``, by default 0, 16, 64 and 1/2, 1, 2, 4, 8 and 16 x train_len. Distances longer
  than the stream are dropped with one warning. A distance whose sequence (2 x span + d - 1 input positions)
  the encoding cannot serve is ``unsupported``.
* Randomness: ``trials`` pairs (A, B) are drawn once and shared by every distance; the filler offsets are
  drawn per distance. Both come from NumPy generators keyed by (``copyseq.COPY_STREAM``, seed[, d]), apart
  from any generator seeded with a training seed alone, and untouched by the global torch or NumPy state
  (``copyseq`` makes the sequences; training draws its own copy sequences there too).
* Per distance (and ``vocab``, empty for every word: part of a row's identity): ``nll_copy`` and
  ``nll_baseline`` are mean NLLs over trials x (span - 1) tokens,
  ``gain`` = nll_baseline - nll_copy (nats), ``accuracy`` and ``accuracy_baseline`` the top-1 accuracy
  on the same tokens.

Top-1 accuracy needs logits, which ``token_nll`` does not give: the probe takes ``logits_fn(idx, last)``,
the logits (B, last, V) of the last ``last`` positions of ``idx`` (B, T), by default
``model.head(model(idx)[:, -last:])``. Both NLL and accuracy come from these logits, in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, List, Optional

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..copyseq import copy_sequences, draw_spans
from ..errors import raise_problems
from ..runtime import autocast
from . import device_of, within_data

COLUMNS = [
    "distance",
    "vocab",
    "trials",
    "nll_copy",
    "nll_baseline",
    "gain",
    "accuracy",
    "accuracy_baseline",
    "status",
    "reason",
]
#: copy_reach: below this gain at d = 0 (nats), the model has not learned to copy. Models that never learned
#: gain up to about 0.3 nats at every distance alike (the span's words made likelier by the first copy, not
#: copied), which the half-of-d = 0 rule would read as reaching every distance; copiers gain 2 nats or more.
MIN_COPY_GAIN = 1.0

LogitsFn = Callable[[Tensor, int], Tensor]


@dataclass
class CopyProbeConfig:
    #: Tokens in the random span.
    span: int = 32
    #: Filler lengths d (``null``: 0, 16, 64 and 1/2, 1, 2, 4, 8, 16 x train_len).
    distances: Optional[List[int]] = None
    #: Sequences per distance (each with its baseline).
    trials: int = 64
    #: Seed of the spans and filler offsets (keyed apart from training seeds by ``COPY_STREAM``).
    seed: int = 0
    #: Spans draw from the training split's this many most frequent words (``null``: from every word).
    vocab: Optional[int] = None

    def __post_init__(self):
        raise_problems(self.problems())  # ProblemsFound, a ValueError: every broken rule at once

    def problems(self) -> list[str]:
        found = []
        if self.span < 2:
            found.append(f"probe.span={self.span} must be at least 2 (its tokens 2..span are scored)")
        if self.trials < 1:
            found.append(f"probe.trials={self.trials} must be at least 1")
        if self.distances is not None and (not self.distances or min(self.distances) < 0):
            found.append(f"probe.distances={list(self.distances)} must be non-negative integers")
        if self.vocab is not None and self.vocab < 2:
            found.append(f"probe.vocab={self.vocab} must be at least 2 words or null (every word)")
        return found


def default_distances(train_len: int) -> list[int]:
    """0, 16, 64 and 1/2, 1, 2, 4, 8, 16 x train_len."""
    return sorted({0, 16, 64, train_len // 2, *(train_len * f for f in (1, 2, 4, 8, 16))})


def default_logits_fn(model: nn.Module) -> LogitsFn:
    """Logits of the last ``last`` positions, the LM head applied to those positions only, in the model's
    precision (bf16 autocast for a bf16 run, as ``token_nll`` and the evaluation compute)."""

    def logits(idx: Tensor, last: int) -> Tensor:
        with autocast(idx.device, model.precision):
            return model.head(model(idx)[:, -last:])

    return logits


@torch.no_grad()
def score_copies(logits_fn: LogitsFn, sequences: Tensor, span: int, batch_tokens: int, device) -> tuple[Tensor, Tensor]:
    """NLL and top-1 hit (both (N, span - 1), float64) of each sequence's last span - 1 tokens."""
    last = span - 1
    per_batch = max(1, batch_tokens // sequences.shape[1])
    nll, hit = [], []
    for batch in sequences.split(per_batch):
        batch = batch.to(device)
        logits = logits_fn(batch[:, :-1], last).float()  # (B, last, V)
        targets = batch[:, -last:]
        nll.append(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets))
        hit.append(logits.argmax(-1) == targets)
    return torch.cat(nll).double().cpu(), torch.cat(hit).double().cpu()


def summarize(nll: Tensor, hit: Tensor, trials: int) -> dict:
    """One distance's scores from the per-token NLL and hits of its copies (the first ``trials``) and baselines."""
    nll_copy, nll_baseline = nll[:trials].mean().item(), nll[trials:].mean().item()
    return dict(
        nll_copy=nll_copy,
        nll_baseline=nll_baseline,
        gain=nll_baseline - nll_copy,
        accuracy=hit[:trials].mean().item(),
        accuracy_baseline=hit[trials:].mean().item(),
    )


def copy_probe(
    model: nn.Module,
    tokens: Tensor,
    symbols: Tensor | int,
    train_len: int,
    cfg: CopyProbeConfig,
    batch_tokens: int,
    logits_fn: LogitsFn | None = None,
    measured: Collection[int] = (),
    on_row: Callable[[pd.DataFrame], None] | None = None,
) -> pd.DataFrame:
    """The copy probe of ``model``, filler from ``tokens`` (1-D), spans from ``symbols`` (the words of
    ``copyseq.copy_symbols(train split, vocab size, cfg.vocab)``, or the vocabulary's size: every word): one row
    per distance; see the module.

    ``measured``: distances left out (measured already, by an interrupted attempt on the same weights);
    ``on_row``: called with each distance's row as soon as it is measured (a long probe's rows are kept
    as it goes)."""
    model.eval()
    logits_fn = logits_fn or default_logits_fn(model)
    distances = within_data(cfg.distances or default_distances(train_len), len(tokens), "probe.distances")
    spans = draw_spans(symbols, cfg)
    rows = []
    for distance in (d for d in distances if d not in measured):
        where = dict(distance=distance, vocab=cfg.vocab, trials=cfg.trials)
        reason = model.encoding.unsupported_reason(2 * cfg.span + distance - 1)
        if reason:
            rows.append(dict(where, status="unsupported", reason=reason))
        else:
            sequences = torch.cat(copy_sequences(tokens, spans, distance, cfg.seed))  # copies, then baselines
            nll, hit = score_copies(logits_fn, sequences, cfg.span, batch_tokens, device_of(model))
            rows.append(dict(where, **summarize(nll, hit, cfg.trials), status="ok", reason=""))
        if on_row is not None:
            on_row(pd.DataFrame(rows[-1:], columns=COLUMNS))
    return pd.DataFrame(rows, columns=COLUMNS)


@dataclass
class CopyReach:
    """How far the model copies: the largest distance, or ``None`` with status ``no_copying``."""

    distance: Optional[int]
    status: str


def copy_reach(df: pd.DataFrame) -> CopyReach:
    """The largest served distance whose gain is at least half the gain at d = 0.

    Status ``no_copying`` (no distance) when the gain at d = 0 is under ``MIN_COPY_GAIN`` nats.
    """
    ok = df[df["status"] == "ok"].set_index("distance")["gain"]
    if 0 not in ok.index:
        raise ValueError("copy_reach needs a served row at distance 0 (probe.distances must include 0)")
    if not ok[0] >= MIN_COPY_GAIN:  # NaN too
        return CopyReach(None, "no_copying")
    return CopyReach(int(ok.index[ok >= ok[0] / 2].max()), "ok")
