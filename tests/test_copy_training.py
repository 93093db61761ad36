"""train.copy_fraction: that fraction of each batch's sequences are synthetic copy sequences."""

import numpy as np
import pytest
import torch

from posbench.copyseq import draw_spans, with_copies
from posbench.probes.copy import CopyProbeConfig

VOCAB, B, T = 1000, 8, 40


def batch():
    tokens = torch.arange(5000) % 700 + 300  # text ids 300..999 count up: any filler is a run of +1 steps
    starts = torch.randint(0, len(tokens) - T - 1, (B,), generator=torch.Generator().manual_seed(0))
    x = torch.stack([tokens[s : s + T] for s in starts])
    y = torch.stack([tokens[s + 1 : s + T + 1] for s in starts])
    return tokens, x, y


def copy_layout(row: torch.Tensor, span: int) -> int | None:
    """The distance d if ``row`` is span, d text tokens, span again, more text; else None."""
    for d in range(len(row) - 2 * span + 1):
        filler = torch.cat([row[span : span + d], row[2 * span + d :]])
        steps = (filler[1:] - filler[:-1]) % 700
        if torch.equal(row[:span], row[span + d : 2 * span + d]) and bool((steps == 1).all()):
            return d
    return None


@pytest.mark.parametrize("fraction, copies", [(0.5, 4), (0.25, 2), (1.0, 8), (0.0, 0)])
def test_the_fraction_of_copy_sequences_is_honoured(fraction, copies):
    tokens, x, y = batch()
    cx, cy = with_copies(x, y, tokens, VOCAB, fraction, span=8, seed=0, step=3)
    assert torch.equal(cx[:, 1:], cy[:, :-1])  # still next-token pairs
    changed = [row for row in range(B) if not torch.equal(cx[row], x[row])]
    assert len(changed) == copies
    sequences = torch.cat([cx, cy[:, -1:]], 1)
    distances = [copy_layout(sequences[row], 8) for row in changed]
    assert None not in distances
    untouched = [row for row in range(B) if row not in changed]
    assert all(torch.equal(cy[row], y[row]) for row in untouched)


def test_copies_are_drawn_per_step_apart_from_the_probe():
    tokens, x, y = batch()
    first = with_copies(x, y, tokens, VOCAB, 1.0, span=8, seed=0, step=3)
    assert torch.equal(with_copies(x, y, tokens, VOCAB, 1.0, span=8, seed=0, step=3)[0], first[0])  # redone: same
    assert not torch.equal(with_copies(x, y, tokens, VOCAB, 1.0, span=8, seed=0, step=4)[0], first[0])
    probe_spans = torch.cat(draw_spans(VOCAB, CopyProbeConfig(span=8, trials=B, seed=0)))
    training_spans = first[0][:, :8]
    assert not any(torch.equal(t, p) for t in training_spans for p in probe_spans)


def test_the_span_is_capped_at_half_the_sequence():
    tokens, x, y = batch()
    cx, cy = with_copies(x, y, tokens, VOCAB, 1.0, span=64, seed=0, step=1)
    sequences = torch.cat([cx, cy[:, -1:]], 1)
    assert all(copy_layout(row, (T + 1) // 2) is not None for row in sequences)
    assert np.all(sequences.numpy() < VOCAB)
