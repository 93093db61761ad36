"""Probes of whether a trained model reads its context, beyond perplexity.

* :mod:`.context`: the context-usage curve (NLL of fixed targets against the left context they see);
* :mod:`.copy`: long-range copy (how well a random span is predicted when it repeats d tokens later);
* :mod:`.attention`: attention anatomy (entropy, distance, far mass per head; bias curves).

The window counterfactual is an evaluation with ``eval.window`` (``Attention.evaluated_as``).
Each probe is a function of a model, a token stream and its options that returns a DataFrame
without the run's identity columns (encoding, variant, train_len, seed); :mod:`.config` holds
their names and options, :mod:`.suite` runs them and writes their CSVs. This package holds
what the probes share.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

log = logging.getLogger(__name__)


def device_of(model: nn.Module) -> torch.device:
    """The device the model's parameters live on (the probes build their inputs there)."""
    return next(model.parameters()).device


def within_data(values: Iterable[int], limit: int, key: str) -> list[int]:
    """Sorted distinct ``values`` up to ``limit``; the ones above it are dropped with one warning naming ``key``."""
    values = sorted({int(v) for v in values})
    kept = [v for v in values if v <= limit]
    if len(kept) < len(values):
        log.warning("%s %s dropped: the data allows at most %d", key, values[len(kept) :], limit)
    return kept
