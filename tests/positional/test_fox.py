"""FoX against a transcription of its reference forward pass: the gate of zhixuan-lin/forgetting-transformer's
``ForgettingAttentionLayer`` (fgate_type="full", no RoPE, no output gate or norm, no QK-norm or shifts) and
fla's ``naive_forgetting_attn`` (fla/ops/forgetting_attn/naive.py): outputs and gradients, in float64; and
FoX's ``score_mod`` on FlexAttention against it and against eager, forward in float32."""

import pytest
import torch
import torch.nn.functional as F

from posbench.attention import Attention
from posbench.variant import AS_TRAINED, AttentionVariant


def reference(x, w_qkv, w_proj, w_gate, b_gate, n_heads, boundary: int = 0):
    """The reference layer on x (B, T, D), in its [B, T, H, D] layout; ``boundary`` shifts the cumulative
    sum by that many tokens (a mutant: 1 sums log f over j..i-1 instead of j+1..i)."""
    B, T, D = x.shape
    q, k, v = (x @ w.T for w in w_qkv.chunk(3))  # (B, T, D) each
    q, k, v = (t.view(B, T, n_heads, D // n_heads) for t in (q, k, v))
    g = F.logsigmoid(x @ w_gate.T + b_gate)  # (B, T, H): log f
    gc = g.cumsum(1)
    if boundary:
        gc = F.pad(gc, (0, 0, boundary, -boundary))
    scale = (D // n_heads) ** -0.5
    scores = torch.einsum("bqhd,bkhd->bhqk", q * scale, k)
    scores = scores + gc.permute(0, 2, 1)[..., :, None] - gc.permute(0, 2, 1)[..., None, :]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    scores = scores.masked_fill(~mask, float("-inf"))
    o = torch.einsum("bhqk,bkhd->bqhd", F.softmax(scores, dim=-1), v)  # (B, T, H, hd)
    return o.reshape(B, T, D) @ w_proj.T


def outputs_and_grads(layer, plan, x, reference_pass: bool, boundary: int = 0):
    weights = [layer.qkv.weight, layer.proj.weight, layer.terms.proj.weight, layer.terms.proj.bias]
    if reference_pass:
        y = reference(x, *weights, n_heads=4, boundary=boundary)
    else:
        y = layer(x, plan)
    seen = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=y.dtype)
    return y, torch.autograd.grad((y * seen).sum(), [x, *weights])


@pytest.mark.parametrize("seq_len", [16, 300])
def test_layer_equals_the_reference(content_layer, seq_len):
    layer, plan = content_layer("fox", seq_len)
    x = torch.randn(2, seq_len, 32, dtype=torch.float64, requires_grad=True)
    y, grads = outputs_and_grads(layer, plan, x, reference_pass=False)
    y_ref, grads_ref = outputs_and_grads(layer, plan, x, reference_pass=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


def test_the_comparison_sees_a_shifted_cumulative_sum(content_layer):
    layer, plan = content_layer("fox", 16)
    x = torch.randn(2, 16, 32, dtype=torch.float64, requires_grad=True)
    y, _ = outputs_and_grads(layer, plan, x, reference_pass=False)
    mutant, _ = outputs_and_grads(layer, plan, x, reference_pass=True, boundary=1)
    assert not torch.allclose(y, mutant, rtol=1e-6, atol=1e-6)


def fox_layer_on(content_layer, backend: str, seq_len: int):
    """``content_layer``'s FoX layer (weights N(0, 0.3²): every token's gates differ) in float32 on ``backend``."""
    layer, _ = content_layer("fox", seq_len)
    layer.float()
    layer.attention = Attention(backend, layer.attention.encoding)
    return layer


@torch.no_grad()
def evaluated(layer, x, variant=AS_TRAINED):
    with layer.attention.evaluated_as(variant):
        plan = layer.attention.plan(x.shape[1], x.device, False, 0.0)
        return plan.backend, layer(x, plan)


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [200, 300])  # padded to 256 and 384 tokens: whole flex blocks
def test_flex_equals_the_reference_and_eager(content_layer, seq_len):
    flex, eager = (fox_layer_on(content_layer, backend, seq_len) for backend in ("flex", "eager"))
    x = torch.randn(2, seq_len, 32, generator=torch.Generator().manual_seed(1))
    backend, y = evaluated(flex, x)
    weights = [flex.qkv.weight, flex.proj.weight, flex.terms.proj.weight, flex.terms.proj.bias]
    assert backend == "flex" and not flex.attention.flex_broken
    torch.testing.assert_close(y, reference(x, *weights, n_heads=4), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, evaluated(eager, x)[1], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_flex_comparison_sees_a_shifted_cumulative_sum(content_layer):
    flex = fox_layer_on(content_layer, "flex", 200)
    x = torch.randn(2, 200, 32, generator=torch.Generator().manual_seed(1))
    weights = [flex.qkv.weight, flex.proj.weight, flex.terms.proj.weight, flex.terms.proj.bias]
    mutant = reference(x, *weights, n_heads=4, boundary=1)
    assert not torch.allclose(evaluated(flex, x)[1], mutant, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [dict(window=50), dict(window=40, sink=130)])  # across blocks, sinks too
def test_flex_equals_eager_with_a_window(content_layer, variant):
    flex, eager = (fox_layer_on(content_layer, backend, 300) for backend in ("flex", "eager"))
    with torch.no_grad():
        for layer in (flex, eager):  # f near 1: keys beyond the window still count, so that cutting them shows
            layer.terms.proj.bias += 4.0
    x = torch.randn(2, 300, 32, generator=torch.Generator().manual_seed(1))
    (backend, y), (_, expected) = (evaluated(layer, x, AttentionVariant(**variant)) for layer in (flex, eager))
    assert backend == "flex" and not torch.allclose(expected, evaluated(eager, x)[1])  # the window cut keys
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)


def test_gate_starts_at_the_references_initialisation(tiny_lm):
    lm = tiny_lm("fox")
    gates = [block.attn.terms.proj for block in lm.blocks]
    assert all(torch.equal(g.bias, torch.zeros_like(g.bias)) for g in gates)  # f = σ(0) = 1/2 before the input
    assert all(0.01 < g.weight.std().item() < 0.03 for g in gates)  # the model's normal(0, 0.02)
    assert sorted(k for k in lm.state_dict() if "terms" in k)[:2] == [
        "blocks.0.attn.terms.proj.bias",
        "blocks.0.attn.terms.proj.weight",
    ]
    assert sum(p.numel() for p in lm.encoding_parameters()) == len(lm.blocks) * (32 + 1) * lm.cfg.n_heads
