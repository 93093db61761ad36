"""Attention anatomy on patterns whose answer is known, and the bias curves of bias encodings."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from posbench.model import LanguageModel, ModelConfig
from posbench.positional import build_encoding
from posbench.probes import attention as anatomy
from posbench.probes.attention import COLUMNS, attention_stats, bias_curves, head_stats

T, L = 24, 8  # sequence length, train_len
TINY = ModelConfig(name="tiny", n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0, attention="sdpa")


def encoding(name: str, n_heads: int = 2):
    return build_encoding({"name": name}, n_heads=n_heads, head_dim=4, d_model=4 * n_heads, train_len=L)


def test_uniform_attention_over_n_keys_has_entropy_ln_n():
    """q = 0 without bias: query i spreads evenly over its i + 1 keys (distances 0..i)."""
    q = torch.zeros(2, T, 4)
    stats = head_stats(encoding("none"), q, torch.randn(2, T, 4), train_len=L)
    i = np.arange(T)
    expected_entropy = np.log(i + 1).mean()
    expected_distance = (i / 2).mean()
    far = i[i >= L]
    expected_beyond = ((far - L) / (far + 1)).mean()  # keys 0..i-L-1 lie more than L back
    for h in range(2):
        assert stats["entropy"][h].item() == pytest.approx(expected_entropy, rel=1e-6)
        assert stats["mean_distance"][h].item() == pytest.approx(expected_distance, rel=1e-6)
        assert stats["mass_beyond_train_len"][h].item() == pytest.approx(expected_beyond, rel=1e-6)
    single = head_stats(encoding("none"), torch.zeros(2, 5, 4), torch.randn(2, 5, 4), train_len=L)
    assert single["entropy"][0].item() == pytest.approx(np.log(np.arange(1, 6)).mean())
    assert math.isnan(single["mass_beyond_train_len"][0].item())  # no query is L tokens in


def test_attention_fixed_on_the_first_token():
    """Every query looks at key 0 only: distance i, entropy 0, all its mass beyond L once i > L."""
    q = torch.zeros(1, T, 4)
    q[..., 0] = 40.0
    k = torch.zeros(1, T, 4)
    k[:, 0, 0] = 40.0
    stats = head_stats(encoding("none", n_heads=1), q, k, train_len=L)
    assert stats["entropy"][0].item() == pytest.approx(0.0, abs=1e-6)
    assert stats["mean_distance"][0].item() == pytest.approx((T - 1) / 2, rel=1e-6)
    assert stats["mass_beyond_train_len"][0].item() == pytest.approx((T - L - 1) / (T - L), rel=1e-6)


def test_query_blocks_give_the_same_numbers(monkeypatch):
    """ALiBi, random q and k: blocks of 5 queries against the whole matrix at once."""
    alibi = encoding("alibi")
    q, k = torch.randn(2, 2, T, 4).unbind(0)
    whole = head_stats(alibi, q, k, train_len=L)
    monkeypatch.setattr(anatomy, "MASK_BUDGET", 4 * 2 * T * 5)
    blocks = head_stats(alibi, q, k, train_len=L)
    for name in whole:
        torch.testing.assert_close(blocks[name], whole[name])


def tiny_model(name: str) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(TINY, OmegaConf.create({"name": name}), vocab_size=30, train_len=L).eval()


def test_attention_stats_have_a_row_per_length_layer_and_head():
    tokens = torch.randint(0, 30, (16 * L + 5,), generator=torch.Generator().manual_seed(0))
    df = attention_stats(tiny_model("alibi"), tokens, train_len=L)
    assert list(df.columns) == COLUMNS
    assert len(df) == 3 * TINY.n_layers * TINY.n_heads
    assert sorted(set(df["eval_len"])) == [L, 4 * L, 16 * L]
    assert (df["status"] == "ok").all() and (df["entropy"] > 0).all()
    assert df[df["eval_len"] == L]["mass_beyond_train_len"].isna().all()
    assert df[df["eval_len"] > L]["mass_beyond_train_len"].between(0, 1).all()


def test_learned_beyond_its_table_is_unsupported_and_short_data_drops_lengths(caplog):
    tokens = torch.randint(0, 30, (4 * L,), generator=torch.Generator().manual_seed(0))
    df = attention_stats(tiny_model("learned"), tokens, train_len=L)
    assert df.set_index("eval_len")["status"].groupby(level=0).first().to_dict() == {L: "ok", 4 * L: "unsupported"}
    assert "dropped" in caplog.text  # 16 x L is longer than the data


def test_bias_curves_of_alibi_are_its_slopes_times_distance():
    alibi = encoding("alibi", n_heads=2)  # slopes 1/16 and 1/256
    df = bias_curves(alibi, train_len=L)
    assert df["distance"].min() == 0 and df["distance"].max() == 16 * L
    for head, slope in enumerate([1 / 16, 1 / 256]):
        curve = df[df["head"] == head]
        np.testing.assert_allclose(curve["bias"], -slope * curve["distance"], rtol=1e-6)
    assert bias_curves(encoding("rope"), train_len=L).empty


def test_content_terms_make_the_weights_the_probe_reads():
    """Stick-breaking with q = 0 (β = 1/2 everywhere): query i gives key j < i the weight 2^-(i-j) and itself
    the 2^-i left over, not the uniform weights a softmax would give."""
    sb = encoding("stickbreaking")
    stats = head_stats(sb, torch.zeros(2, T, 4), torch.randn(2, T, 4), train_len=L, terms=sb.layer_terms())
    distance = [sum(d * 2.0**-d for d in range(1, i + 1)) for i in range(T)]  # the query itself is at distance 0
    np.testing.assert_allclose(stats["mean_distance"].numpy(), np.mean(distance), rtol=1e-6)
