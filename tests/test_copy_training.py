"""train.copy_fraction: that fraction of each batch's sequences are synthetic copy sequences."""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posbench.copyseq import copy_symbols, draw_spans, with_copies
from posbench.data import build_corpus
from posbench.distributed import World
from posbench.errors import PosbenchError
from posbench.lengths import counts_for_patience
from posbench.probes.copy import CopyProbeConfig
from posbench.tasks.base import IGNORE
from posbench.train import train_step, training_batch
from posbench.training_run import prepare

VOCAB, B, T = 1000, 8, 40
EVERY_WORD = torch.arange(VOCAB)


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
    cx, cy = with_copies(x, y, tokens, EVERY_WORD, fraction, span=8, seed=0, step=3)
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
    first = with_copies(x, y, tokens, EVERY_WORD, 1.0, span=8, seed=0, step=3)
    assert torch.equal(with_copies(x, y, tokens, EVERY_WORD, 1.0, span=8, seed=0, step=3)[0], first[0])  # redone: same
    assert not torch.equal(with_copies(x, y, tokens, EVERY_WORD, 1.0, span=8, seed=0, step=4)[0], first[0])
    probe_spans = torch.cat(draw_spans(VOCAB, CopyProbeConfig(span=8, trials=B, seed=0)))
    training_spans = first[0][:, :8]
    assert not any(torch.equal(t, p) for t in training_spans for p in probe_spans)


def test_copy_loss_repeat_leaves_out_exactly_the_first_spans_targets():
    """Targets 1..span-1 of a copy row (its first span's random tokens) are IGNORE; the span's first token
    is no target anyway; the repeat, the filler and every text row keep theirs; the inputs are unchanged."""
    tokens, x, y = batch()
    plain_x, plain_y = with_copies(x, y, tokens, EVERY_WORD, 0.5, span=8, seed=0, step=3)
    cx, cy = with_copies(x, y, tokens, EVERY_WORD, 0.5, span=8, seed=0, step=3, loss="repeat")
    assert torch.equal(cx, plain_x)
    copies = [row for row in range(B) if not torch.equal(plain_x[row], x[row])]
    assert len(copies) == 4
    for row in range(B):
        ignored = (cy[row] == IGNORE).nonzero().flatten().tolist()
        assert ignored == (list(range(7)) if row in copies else []), row
        kept = cy[row] != IGNORE
        assert torch.equal(cy[row][kept], plain_y[row][kept])


def test_copy_loss_copy_keeps_exactly_the_repeats_predictable_targets():
    """A copy row keeps the targets that are the repeat's tokens 2..S, which equal its first span's 2..S (found
    here by the row's layout); text rows keep every target; the inputs are unchanged."""
    tokens, x, y = batch()
    plain_x, plain_y = with_copies(x, y, tokens, EVERY_WORD, 0.5, span=8, seed=0, step=3)
    cx, cy = with_copies(x, y, tokens, EVERY_WORD, 0.5, span=8, seed=0, step=3, loss="copy")
    assert torch.equal(cx, plain_x)
    sequences = torch.cat([cx, plain_y[:, -1:]], 1)
    copies = [row for row in range(B) if not torch.equal(plain_x[row], x[row])]
    assert len(copies) == 4
    for row in range(B):
        kept = (cy[row] != IGNORE).nonzero().flatten()
        if row in copies:
            d = copy_layout(sequences[row], 8)
            assert kept.tolist() == list(range(8 + d, 15 + d))  # target t predicts token t + 1: 9 + d .. 15 + d
            assert torch.equal(cy[row][kept], sequences[row][1:8])
        else:
            assert len(kept) == T and torch.equal(cy[row], y[row])


def test_a_warm_up_of_short_sequences_and_spans_varies_the_copys_offset(compose_config, mini_data, tmp_path):
    """train.copy_warmup_len=8, train.copy_warmup_span=2 (smoke: train_len 32, batch 4): the warm-up's steps
    hold 16 rows of 8 tokens, each a 2-token span, text, the span again, at offsets that vary; a step trains
    on them; after the warm-up, 4 rows of 32 tokens of text."""
    overrides = ["experiment=smoke", f"data.path={mini_data}", "train.copy_warmup_steps=3", "train.copy_warmup_len=8"]
    run = prepare(compose_config("train", [*overrides, "train.copy_warmup_span=2"]), tmp_path, World())
    distances = set()
    for step in (1, 2, 3):
        x, y = training_batch(run, step)
        assert x.shape == (16, 8)
        sequences = torch.cat([x, y[:, -1:]], 1)
        layouts = [next((d for d in range(6) if torch.equal(row[:2], row[2 + d : 4 + d])), None) for row in sequences]
        assert None not in layouts
        distances |= set(layouts)
    assert len(distances) > 2  # the half-sequence warm-up has two: 0 and 1
    assert train_step(run, x, y, 3)[0] > 0
    assert training_batch(run, 4)[0].shape == (4, 32)


def test_the_training_loss_is_the_mean_over_the_targets_in_the_loss(compose_config, mini_data, tmp_path):
    """With train.copy_loss=repeat the step's loss averages the counted targets only."""
    overrides = ["experiment=smoke", f"data.path={mini_data}", "train.copy_fraction=0.5", "train.copy_loss=repeat"]
    run = prepare(compose_config("train", overrides), tmp_path, World())
    x, y = training_batch(run, 1)
    counted = y != IGNORE
    assert 0 < int((~counted).sum()) < counted.numel()
    with torch.no_grad():
        nll = run.loss_fn(x, y)
    expected = float(nll[counted].mean())
    loss, _ = train_step(run, x, y, 1)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert float(nll.mean()) != pytest.approx(expected, rel=1e-3)  # the plain mean would differ


def test_the_span_is_capped_at_half_the_sequence():
    tokens, x, y = batch()
    cx, cy = with_copies(x, y, tokens, EVERY_WORD, 1.0, span=64, seed=0, step=1)
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
    run.copy_symbols = torch.arange(corpus.vocab_size)
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


def test_copy_vocab_is_the_training_texts_most_frequent_words_ties_to_the_lower_id():
    text = torch.tensor([5, 5, 5, 2, 2, 9, 9, 7, 0])  # 5 thrice; 2 and 9 twice; 0 and 7 once
    assert copy_symbols(text, 12, 4).tolist() == [5, 2, 9, 0]
    assert copy_symbols(text, 12, None).tolist() == list(range(12))  # every word, as the probe's spans
    with pytest.raises(PosbenchError, match=r"^train.copy_vocab=13 exceeds the vocabulary's 12 words$"):
        copy_symbols(text, 12, 13)


def test_spans_draw_from_the_copy_vocab_alone(compose_config, mini_data, tmp_path):
    """train.copy_vocab=20: every copied span holds only the 20 most frequent words of the train split (counted
    here independently), while text rows keep the rest of the vocabulary."""
    overrides = ["experiment=smoke", f"data.path={mini_data}", "train.copy_fraction=0.5", "train.copy_vocab=20"]
    run = prepare(compose_config("train", overrides), tmp_path, World())
    counts = Counter(run.corpus.splits["train"].tolist())
    frequent = {word for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:20]}
    x, y = training_batch(run, 1)
    sequences = torch.cat([x, y[:, -1:]], 1)
    span = min(run.cfg.probe.span, sequences.shape[1] // 2)
    gaps = range(sequences.shape[1] - 2 * span + 1)
    copies = [row for row in sequences if any(torch.equal(row[:span], row[span + d : 2 * span + d]) for d in gaps)]
    assert len(copies) == round(0.5 * len(x))
    assert all(set(row[:span].tolist()) <= frequent for row in copies)
    assert not set(x.flatten().tolist()) <= frequent  # the text rows are plain text


def test_a_copy_vocab_beyond_the_vocabulary_stops_the_run_before_it_writes_anything(
    compose_config, mini_data, tmp_path
):
    overrides = ["experiment=smoke", f"data.path={mini_data}", "train.copy_fraction=0.5", "train.copy_vocab=1000000"]
    with pytest.raises(PosbenchError, match=r"^train.copy_vocab=1000000 exceeds the vocabulary's \d+ words$"):
        prepare(compose_config("train", overrides), tmp_path, World())
    assert not any(tmp_path.iterdir())
