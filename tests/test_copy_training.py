"""train.copy_fraction: that fraction of each batch's sequences are synthetic copy sequences."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posbench.copyseq import draw_spans, with_copies
from posbench.data import build_corpus
from posbench.lengths import counts_for_patience
from posbench.probes.copy import CopyProbeConfig
from posbench.train import training_batch

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


def test_the_copy_warm_up_trains_on_pure_copies_then_the_fraction_applies(compose_config):
    """train.copy_warmup_steps=2, train.copy_fraction=0: steps 1 and 2 are copies alone (a span of half the
    sequence, then at once the span again), step 3 is text as drawn."""
    words = [f"w{i % 97}" for i in range(3000)]  # text that repeats no span within 97 tokens
    corpus = build_corpus({"train": [" ".join(words)], "valid": ["a b"], "test": ["a b"]})
    cfg = compose_config("train", ["experiment=smoke", "train.copy_warmup_steps=2", "train.copy_fraction=0"])
    run = SimpleNamespace(cfg=cfg, task=None, corpus=corpus, gen=torch.Generator().manual_seed(0))
    span = (cfg.train_len + 1) // 2  # 16 of the 33 tokens a row of x and y spans at train_len 32

    def copied(row: torch.Tensor) -> bool:  # the span again right after it (one text token may sit between)
        return any(torch.equal(row[:span], row[span + d : 2 * span + d]) for d in range(len(row) - 2 * span + 1))

    for step, copies in ((1, True), (2, True), (3, False)):
        x, y = training_batch(run, step)
        assert x.shape == (cfg.train.batch_size, cfg.train_len) and torch.equal(x[:, 1:], y[:, :-1])
        assert all(copied(row) == copies for row in torch.cat([x, y[:, -1:]], 1))


def test_validations_in_the_copy_warm_up_do_not_count_toward_patience(compose_config):
    """The text loss stalls while the model trains on copies alone: counted, it would stop the run there."""
    cfg = compose_config("train", ["experiment=smoke", "train.copy_warmup_steps=300"])
    assert [counts_for_patience(cfg, step) for step in (100, 300, 301, 400)] == [False, False, True, True]
