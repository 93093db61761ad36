"""Copy sequences: a random span, text, the span again; drawn for the copy probe and for training.

The copy probe (``probes.copy``) scores ``copy_sequences`` built from ``draw_spans``; training with
``train.copy_fraction`` replaces some of each batch's sequences by ``with_copies``. Each draws from a NumPy
generator keyed by its own stream constant, the seed and (for training) the step: apart from each other and from
any generator seeded with a training seed alone, untouched by the global torch or NumPy state, and the same
again when a resumed run redoes a step.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .errors import PosbenchError
from .tasks.base import IGNORE

#: Keys the probe's generators apart from any seeded with a plain training seed.
COPY_STREAM = 0xC0B1
#: Keys the generators of training's copy sequences (``train.copy_fraction``) apart from the probe's.
TRAIN_COPY_STREAM = 0xC0B2


def draw_spans(symbols: Tensor | int, cfg) -> tuple[Tensor, Tensor]:
    """The copied spans A and the baseline spans B, each (``cfg.trials``, ``cfg.span``), drawn independently by
    ``cfg.seed`` (a ``CopyProbeConfig``), uniformly from ``symbols`` (word ids; an int n: the ids 0..n-1)."""
    symbols = torch.arange(symbols) if isinstance(symbols, int) else symbols
    rng = np.random.default_rng([COPY_STREAM, cfg.seed])
    spans = symbols[torch.from_numpy(rng.integers(0, len(symbols), (2, cfg.trials, cfg.span)))]
    return spans[0], spans[1]


def copy_sequences(tokens: Tensor, spans: tuple[Tensor, Tensor], distance: int, seed: int) -> tuple[Tensor, Tensor]:
    """(copy, baseline) sequences (trials, 2 x span + distance): A or B, d tokens of ``tokens``, then A."""
    copied, baseline = spans
    rng = np.random.default_rng([COPY_STREAM, seed, distance])
    offsets = rng.integers(0, len(tokens) - distance + 1, len(copied))
    filler = torch.stack([tokens[o : o + distance] for o in offsets.tolist()]).to(copied)  # (trials, distance)
    return torch.cat([copied, filler, copied], 1), torch.cat([baseline, filler, copied], 1)


def copy_symbols(
    tokens: Tensor, vocab_size: int, most_frequent: int | None, option: str = "train.copy_vocab"
) -> Tensor:
    """The words copy spans draw from, uniformly (``train.copy_vocab``, ``probe.vocab``: the ``option``): the
    ``most_frequent`` words of ``tokens`` (ties to the lower id), or every word of the vocabulary (``None``)."""
    if most_frequent is None:
        return torch.arange(vocab_size)
    if most_frequent > vocab_size:
        raise PosbenchError(f"{option}={most_frequent} exceeds the vocabulary's {vocab_size} words")
    counts = torch.bincount(tokens, minlength=vocab_size)
    return counts.argsort(descending=True, stable=True)[:most_frequent]


def with_copies(
    x: Tensor,
    y: Tensor,
    tokens: Tensor,
    symbols: Tensor,
    fraction: float,
    span: int,
    seed: int,
    step: int,
    loss: str = "all",
) -> tuple[Tensor, Tensor]:
    """Training batch (x, y) with round(fraction x B) of its sequences, chosen at random, replaced by copy sequences.

    A copy sequence (as long as a row of x plus one) is a span of min(``span``, half its length) tokens drawn
    uniformly from ``symbols`` (``copy_symbols``), d tokens of ``tokens`` (d uniform from 0 to what the length
    allows), the span again, then more of the same text. Drawn by a NumPy generator keyed by
    (``TRAIN_COPY_STREAM``, seed, step): apart from the probe's, and the same again when a resumed run redoes
    ``step``. ``loss`` (``train.copy_loss``) keeps a copy row's targets: ``"all"``; ``"repeat"``, all but those
    within the first span (no model can predict a random token); ``"copy"``, only the repeat's tokens 2..S.
    """
    sequences = torch.cat([x, y[:, -1:]], dim=1)  # (B, T + 1): y is x shifted by one
    batch, length = sequences.shape
    rng = np.random.default_rng([TRAIN_COPY_STREAM, seed, step])
    span = min(span, length // 2)
    text = length - 2 * span  # real-text tokens per copy sequence
    rows = rng.choice(batch, round(fraction * batch), replace=False).tolist()
    counted = torch.ones(batch, length - 1, dtype=torch.bool)  # which targets stay in the loss
    for row in rows:
        distance, offset = rng.integers(0, text + 1), rng.integers(0, len(tokens) - text + 1)
        copied = symbols[torch.from_numpy(rng.integers(0, len(symbols), span))].to(sequences)
        filler = tokens[offset : offset + text].to(sequences)
        sequences[row] = torch.cat([copied, filler[:distance], copied, filler[distance:]])
        if loss == "repeat":  # the targets 1..span-1: the first span's own random tokens
            counted[row, : span - 1] = False
        elif loss == "copy":  # the repeat starts at span + d; targets span + d .. are its tokens 2..span
            counted[row] = False
            counted[row, span + distance : 2 * span + distance - 1] = True
    x, y = sequences[:, :-1], sequences[:, 1:]
    return x, y.masked_fill(~counted, IGNORE)  # a new tensor: y apart from x, which shares its storage
