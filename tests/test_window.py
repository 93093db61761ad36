"""The window counterfactual: attention limited to each query's last W keys, in every backend."""

from __future__ import annotations

import math

import pytest
import torch

from posbench import attention as attention_mod
from posbench.masks import causal_mask
from posbench.model import LanguageModel, ModelConfig
from posbench.positional import ENCODINGS, build_encoding
from posbench.probes.context import ContextProbeConfig, context_usage, curve
from posbench.variant import AttentionVariant

TINY = dict(n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
VOCAB, SEQ, WINDOW = 50, 40, 6


def build(name: str, backend: str) -> LanguageModel:
    torch.manual_seed(0)
    lm = LanguageModel(ModelConfig(**TINY, attention=backend), ENCODINGS[name][0](), VOCAB, SEQ)
    with torch.no_grad():
        for p in lm.encoding.parameters():
            p.normal_(0.0, 0.5)
    return lm.eval()


def tokens(length: int = SEQ, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randint(0, VOCAB, (2, 2, length), generator=gen)
    return x, y


@torch.no_grad()
def windowed_nll(lm: LanguageModel, window: int | None, x, y) -> torch.Tensor:
    with lm.attention.evaluated_as(AttentionVariant(window=window)):
        return lm.token_nll(x, y)


def test_banded_mask_matches_one_written_out_by_hand():
    """ALiBi, 2 heads (slopes 1/16, 1/256), window 2: query i sees keys i-1 and i with bias -m (i - j)."""
    alibi = build_encoding({"name": "alibi"}, n_heads=2, head_dim=4, d_model=8, train_len=SEQ)
    pos = torch.arange(5)
    expected = torch.full((1, 2, 5, 5), -math.inf)
    for h, slope in enumerate([1 / 16, 1 / 256]):
        for i in range(5):
            for j in (i - 1, i):
                if j >= 0:
                    expected[0, h, i, j] = -slope * (i - j)
    torch.testing.assert_close(causal_mask(alibi, pos, pos, AttentionVariant(window=2)), expected)
    nope = build_encoding({"name": "none"}, n_heads=2, head_dim=4, d_model=8, train_len=SEQ)
    visible = causal_mask(nope, pos, pos, AttentionVariant(window=3))[0, 0] == 0
    assert visible.tolist() == [[0 <= i - j < 3 for j in range(5)] for i in range(5)]


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["alibi", "rope", "none"])
def test_a_window_as_wide_as_the_sequence_changes_nothing(name, backend):
    x, y = tokens()
    lm = build(name, backend)
    plain = windowed_nll(lm, None, x, y)
    for window in (SEQ, SEQ + 7):
        assert torch.equal(windowed_nll(lm, window, x, y), plain)
        # the very plan of the plain pass: no window, sdpa's causal flag
        with lm.attention.evaluated_as(AttentionVariant(window=window)):
            plan = lm.attention.plan(SEQ, x.device, False, 0.0)
        assert plan.reach.window is None and (plan.mask is None) == (backend == "sdpa" and not lm.encoding.has_bias)


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_sdpa_equals_eager_with_a_window(name):
    x, y = tokens()
    eager = windowed_nll(build(name, "eager"), WINDOW, x, y)
    sdpa = windowed_nll(build(name, "sdpa"), WINDOW, x, y)
    torch.testing.assert_close(sdpa, eager, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(eager, windowed_nll(build(name, "eager"), None, x, y))  # the window did something


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["alibi", "rope"])
def test_query_blocks_keep_the_window(name, backend, monkeypatch):
    """Past MASK_BUDGET, blocks of 7 queries each take only the keys their windows reach."""
    x, y = tokens()
    full = windowed_nll(build(name, backend), WINDOW, x, y)
    monkeypatch.setattr(attention_mod, "MASK_BUDGET", 4 * TINY["n_heads"] * SEQ * 7)
    lm = build(name, backend)
    with lm.attention.evaluated_as(AttentionVariant(window=WINDOW)):
        assert lm.attention.plan(SEQ, x.device, False, 0.0).query_block == 7
    torch.testing.assert_close(windowed_nll(lm, WINDOW, x, y), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["alibi", "rope", "sinusoidal"])
def test_a_windowed_model_does_not_see_past_its_receptive_field(name):
    """With L layers of window W, position t depends only on tokens t - L (W - 1) .. t."""
    x, y = tokens()
    changed = x.clone()
    changed[:, 0] = (changed[:, 0] + 1) % VOCAB
    lm = build(name, "sdpa")
    field = TINY["n_layers"] * (WINDOW - 1) + 1
    a, b = windowed_nll(lm, WINDOW, x, y), windowed_nll(lm, WINDOW, changed, y)
    torch.testing.assert_close(a[:, field:], b[:, field:], atol=0, rtol=0)
    assert not torch.allclose(a[:, :field], b[:, :field])


def test_the_window_is_undone_after_the_block():
    lm = build("alibi", "sdpa")
    with lm.attention.evaluated_as(AttentionVariant(window=4)):
        assert lm.attention.variant.window == 4
    assert lm.attention.variant.window is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "rope"])
def test_flex_equals_eager_with_a_window(name):
    """300 tokens (three 128-token blocks, the last partial), windows inside one block and across two."""
    x, y = tokens(300)
    for window in (50, 200):
        eager = windowed_nll(build(name, "eager"), window, x, y)
        flex = build(name, "flex")
        torch.testing.assert_close(windowed_nll(flex, window, x, y), eager, atol=1e-5, rtol=1e-5)
        assert not flex.attention.flex_broken


def test_a_windowed_model_has_a_flat_context_curve_beyond_its_receptive_field():
    """Receptive field L (W - 1) + 1 = 11 tokens: contexts of 16, 32 and 64 give the same nll; 4 does not."""
    lm = build("alibi", "sdpa")
    stream = torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(3))
    probe = ContextProbeConfig(targets=64, contexts=[4, 16, 32, 64], block=8)
    with lm.attention.evaluated_as(AttentionVariant(window=WINDOW)):
        nll = curve(context_usage(lm, stream, SEQ, probe, batch_tokens=4096))
    assert nll[16] == pytest.approx(nll[64], abs=1e-5) and nll[32] == pytest.approx(nll[64], abs=1e-5)
    assert abs(nll[4] - nll[64]) > 1e-3
