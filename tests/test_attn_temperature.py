"""Attention temperature (``eval.attn_temperature=tau``, Wang et al., 2024): softmax(tau·q·kᵀ/√d + bias)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from posbench.attention import Attention
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.config import EvalConfig
from posbench.evaluate import variant_of
from posbench.positional import build_encoding
from posbench.variant import AttentionVariant

TAU = 1.7


def by_hand(q, k, v, tau: float, slopes: list[float]) -> torch.Tensor:
    """Causal attention in float64 Python: weights exp(tau·q_i·k_j/√d − m_h (i − j)) over j <= i, normalised."""
    out = torch.zeros_like(q)
    _, heads, length, d = q.shape
    for h in range(heads):
        for i in range(length):
            logits = [tau * float(q[0, h, i] @ k[0, h, j]) / math.sqrt(d) - slopes[h] * (i - j) for j in range(i + 1)]
            weights = [math.exp(x - max(logits)) for x in logits]
            for j, w in enumerate(weights):
                out[0, h, i] += w / sum(weights) * v[0, h, j]
    return out


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name, slopes", [("none", [0.0, 0.0]), ("alibi", [1 / 16, 1 / 256])])
def test_the_logits_are_scaled_by_tau_and_the_bias_is_not(backend, name, slopes):
    torch.manual_seed(0)
    q, k, v = (3 * torch.randn(3, 1, 2, 5, 4, dtype=torch.float64)).unbind(0)  # (B, H, T, hd); large: sharp
    attention = Attention(backend, build_encoding({"name": name}, n_heads=2, head_dim=4, d_model=8, train_len=5))
    with attention.evaluated_as(AttentionVariant(temperature=TAU)):
        got = attention(q, k, v, attention.plan(5, q.device, False, 0.0))
    torch.testing.assert_close(got, by_hand(q, k, v, TAU, slopes))
    plain = attention(q, k, v, attention.plan(5, q.device, False, 0.0))  # undone after the block
    torch.testing.assert_close(plain, by_hand(q, k, v, 1.0, slopes))
    assert not torch.allclose(got, plain)


def test_variant_names_the_temperature():
    def eval_cfg(tau, window=None):
        return OmegaConf.structured(EvalConfig(window=window, attn_temperature=tau))

    assert variant_of({"name": "none"}, eval_cfg(1.2)) == "temp1.2"
    assert variant_of({"name": "none"}, eval_cfg(2.0)) == "temp2"
    assert variant_of({"name": "rope"}, eval_cfg(0.75, window=64)) == "window64+temp0.75"
    assert variant_of({"name": "none"}, eval_cfg(None)) == ""


def test_posbench_eval_on_a_finished_run_writes_temperature_and_blockwise_rows(tmp_path, saved_run, compose_config):
    """A saved smoke run (train_len 32) evaluated again: tau 1.5 changes the numbers; blocks of 16 leave
    32 tokens (two blocks) as they were and change 64."""
    run = saved_run(tmp_path / "run", encoding="none")
    register()
    for extra in ([], ["eval.attn_temperature=1.5"], ["eval.blockwise=16"]):
        overrides = [f"checkpoint={run}", "eval_lens=[32,64]", "eval.max_tokens=600", "eval.splits=[test]", *extra]
        evaluate_checkpoint(compose_config("eval", overrides), [o.split("=")[0] for o in overrides], run)
    nll = pd.read_csv(run / "results.csv", keep_default_na=False).set_index(["variant", "eval_len"])["nll"]
    assert set(nll.index.get_level_values("variant")) == {"", "temp1.5", "blockwise16"}
    assert nll[("temp1.5", 32)] != nll[("", 32)]
    assert nll[("blockwise16", 32)] == nll[("", 32)] and nll[("blockwise16", 64)] != nll[("", 64)]


@pytest.mark.parametrize("tau", ["0", "-1.5"])
def test_a_temperature_at_or_below_zero_is_one_line(tau, compose_config):
    from posbench.commands.launch import validate_overrides
    from posbench.errors import PosbenchError

    with pytest.raises(PosbenchError, match=f"eval.attn_temperature must be a positive number or null, got {tau}"):
        validate_overrides("train", ["experiment=smoke", f"eval.attn_temperature={tau}"], False)


@pytest.mark.slow
def test_cli_eval_with_a_bad_temperature_is_one_line_and_exit_2(tmp_path, saved_run, posbench, assert_one_line):
    run = saved_run(tmp_path / "run")
    done = posbench("eval", f"checkpoint={run}", "eval.attn_temperature=0")
    assert_one_line(done, "eval.attn_temperature must be a positive number or null, got 0.0")
    assert not (run / "results.csv").exists()
