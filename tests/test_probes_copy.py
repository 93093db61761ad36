"""The long-range copy probe on models whose answer is known: a hand-built copier and a random-weights tiny LM."""

import collections
import logging

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from posbench.copyseq import copy_symbols
from posbench.errors import PosbenchError
from posbench.positional import Dimensions, EncodingConfig, PositionEncoding
from posbench.probes.copy import (
    COLUMNS,
    CopyProbeConfig,
    copy_probe,
    copy_reach,
    copy_sequences,
    default_distances,
    draw_spans,
)


class Copier(nn.Module):
    """Predicts the token that followed the latest earlier occurrence of the current token (an induction head)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.anchor = nn.Parameter(torch.zeros(()), requires_grad=False)  # gives the probe a device
        self.encoding = PositionEncoding(EncodingConfig(), Dimensions(n_heads=1, head_dim=1, d_model=1, train_len=1))

    def logits(self, idx, last):
        T = idx.shape[1]
        earlier = torch.ones(T, T, dtype=torch.bool).tril(-1)  # key i < query j
        match = (idx[:, :, None] == idx[:, None, :]) & earlier  # (B, T, T)
        latest = (match * torch.arange(T)).argmax(-1)  # (B, T): latest earlier match (0 when none)
        found = match.any(-1)
        following = idx.gather(1, (latest + 1).clamp(max=T - 1))
        logits = torch.zeros(*idx.shape, self.vocab)
        logits.scatter_(-1, following[..., None], torch.where(found, 20.0, 0.0)[..., None])
        return logits[:, -last:]


@pytest.fixture
def tiny_model(tiny_lm):
    return lambda name, vocab, train_len=16: tiny_lm(name, vocab=vocab, train_len=train_len).eval()


def stream(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_sequences_repeat_the_span_after_real_text():
    tokens = torch.arange(1000, 1500)  # distinct, increasing: a filler window is a run of consecutive ids
    cfg = CopyProbeConfig(span=5, trials=6, seed=3)
    spans = draw_spans(100, cfg)
    copy, baseline = copy_sequences(tokens, spans, distance=7, seed=cfg.seed)
    assert copy.shape == baseline.shape == (6, 5 + 7 + 5)
    assert torch.equal(copy[:, :5], spans[0]) and torch.equal(copy[:, -5:], spans[0])
    assert torch.equal(baseline[:, :5], spans[1]) and not torch.equal(spans[0], spans[1])
    assert torch.equal(baseline[:, 5:], copy[:, 5:])
    filler = copy[:, 5:12]
    assert (filler >= 1000).all() and (filler.diff(dim=1) == 1).all()
    assert copy_sequences(tokens, spans, distance=0, seed=cfg.seed)[0].shape == (6, 10)


def test_spans_come_from_the_probes_own_generator():
    cfg = CopyProbeConfig(span=8, trials=4, seed=0)
    torch.manual_seed(1)
    np.random.seed(1)
    first = draw_spans(1000, cfg)
    torch.manual_seed(2)
    np.random.seed(2)
    assert all(torch.equal(a, b) for a, b in zip(first, draw_spans(1000, cfg)))  # global state plays no part
    assert not torch.equal(first[0], draw_spans(1000, CopyProbeConfig(span=8, trials=4, seed=1))[0])
    training_like = np.random.default_rng(0).integers(0, 1000, (2, 4, 8))  # a generator seeded with seed 0 alone
    assert not np.array_equal(first[0].numpy(), training_like[0])


def test_spans_of_every_word_are_the_probes_uniform_draws():
    """probe.vocab null: the generator keyed by (0xC0B1, seed), integers below the vocabulary size, A then B."""
    cfg = CopyProbeConfig(span=6, trials=5, seed=4)
    expected = np.random.default_rng([0xC0B1, 4]).integers(0, 300, (2, 5, 6))
    assert all(np.array_equal(s.numpy(), e) for s, e in zip(draw_spans(300, cfg), expected))


def test_spans_of_probe_vocab_words_are_the_training_splits_most_frequent():
    train = torch.tensor([7] * 9 + [3] * 8 + [11] * 7 + [2] * 5 + list(range(20)))  # 7, 3, 11, 2 lead
    counts = collections.Counter(train.tolist())
    top = {w for w, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[:3]}
    assert top == {7, 3, 11}
    cfg = CopyProbeConfig(span=8, trials=16, seed=0, vocab=3)
    spans = draw_spans(copy_symbols(train, 20, cfg.vocab, "probe.vocab"), cfg)
    assert all(set(s.flatten().tolist()) == top for s in spans)  # those words only, each of them drawn
    with pytest.raises(PosbenchError, match="probe.vocab=21 exceeds the vocabulary's 20 words"):
        copy_symbols(train, 20, 21, "probe.vocab")


def test_rows_name_the_words_their_spans_drew_from():
    vocab = 5000
    model, tokens = Copier(vocab), stream(2000, vocab)
    symbols = copy_symbols(tokens, vocab, 64, "probe.vocab")
    for words, draw_from in ((None, vocab), (64, symbols)):
        cfg = CopyProbeConfig(span=8, distances=[0, 32], trials=4, vocab=words)
        df = copy_probe(model, tokens, draw_from, 16, cfg, batch_tokens=512, logits_fn=model.logits)
        assert df["vocab"].tolist() == [words, words] and (df["gain"] > 1.0).all()


def test_a_copying_model_gains_at_every_distance():
    vocab, train_len = 5000, 16  # few chance repeats of span tokens in the filler
    model = Copier(vocab)
    cfg = CopyProbeConfig(span=16, trials=8, seed=0)
    df = copy_probe(model, stream(2000, vocab), vocab, train_len, cfg, batch_tokens=512, logits_fn=model.logits)
    assert list(df.columns) == COLUMNS
    assert df["distance"].tolist() == default_distances(train_len) == [0, 8, 16, 32, 64, 128, 256]
    assert (df["status"] == "ok").all() and (df["trials"] == 8).all()
    assert (df["gain"] > 1.0).all() and (df["gain"] == df["nll_baseline"] - df["nll_copy"]).all()
    assert (df["accuracy"] > 0.8).all() and (df["accuracy_baseline"] < 0.2).all()
    assert copy_reach(df).distance == 256 and copy_reach(df).status == "ok"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_random_weights_gain_about_nothing_and_nll_matches_token_nll(tiny_model, precision):
    """In the run's precision: a bf16 run's probe computes under bf16 autocast, as its evaluation does."""
    vocab = 50
    model, tokens = tiny_model("rope", vocab), stream(500, vocab)
    model.precision = precision
    cfg = CopyProbeConfig(span=8, distances=[0, 16, 40], trials=6, seed=0)
    df = copy_probe(model, tokens, vocab, 16, cfg, batch_tokens=256)
    assert (df["gain"].abs() < 0.03).all()
    assert copy_reach(df).status == "no_copying" and copy_reach(df).distance is None
    copy, _ = copy_sequences(tokens, draw_spans(vocab, cfg), 16, cfg.seed)  # independent path: token_nll
    with torch.no_grad():
        nll = model.token_nll(copy[:, :-1], copy[:, 1:])[:, -(cfg.span - 1) :]
    assert df.loc[df["distance"] == 16, "nll_copy"].item() == pytest.approx(nll.mean().item(), abs=1e-5)


def test_distances_beyond_the_data_are_dropped_with_one_warning(caplog):
    model = Copier(100)
    cfg = CopyProbeConfig(span=4, trials=2)
    with caplog.at_level(logging.WARNING, logger="posbench.probes"):
        df = copy_probe(model, stream(100, 100), 100, 16, cfg, batch_tokens=256, logits_fn=model.logits)
    assert df["distance"].tolist() == [0, 8, 16, 32, 64]
    assert len(caplog.records) == 1 and "probe.distances" in caplog.records[0].getMessage()


def test_learned_positions_beyond_the_table_give_unsupported_rows(tiny_model):
    vocab = 50
    cfg = CopyProbeConfig(span=4, distances=[0, 9, 10, 32], trials=2)
    df = copy_probe(tiny_model("learned", vocab), stream(200, vocab), vocab, 16, cfg, batch_tokens=256)
    assert df["status"].tolist() == ["ok", "ok", "unsupported", "unsupported"]  # 2 x 4 + 9 - 1 = 16 inputs fit
    assert df[df["status"] == "unsupported"]["reason"].str.contains("cannot serve").all()


def reach_frame(gains: dict[int, float]) -> pd.DataFrame:
    rows = [dict(distance=d, gain=g, status="ok") for d, g in gains.items()]
    return pd.DataFrame(rows + [dict(distance=4096, gain=float("nan"), status="unsupported")])


def test_copy_reach_from_known_gains():
    assert copy_reach(reach_frame({0: 1.0, 16: 0.8, 64: 0.5, 128: 0.4, 256: 0.1})).distance == 64
    assert copy_reach(reach_frame({0: 1.0, 16: 0.3, 64: 0.6})).distance == 64  # the largest, not the first gap
    for gains in ({0: 0.09, 16: 0.08}, {0: 0.3, 16: 0.3, 64: 0.3}):  # a flat gain under 1 nat: no copier
        low = copy_reach(reach_frame(gains))
        assert (low.distance, low.status) == (None, "no_copying")
    with pytest.raises(ValueError, match="distance 0"):
        copy_reach(reach_frame({16: 1.0}))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(span=1), "probe.span"),
        (dict(trials=0), "probe.trials"),
        (dict(distances=[-1]), "probe.distances"),
        (dict(vocab=1), "probe.vocab=1 must be at least 2 words"),
    ],
)
def test_bad_options_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        CopyProbeConfig(**kwargs)
