"""Stick-breaking attention against a transcription of its authors' reference (shawntan/stickbreaking-attention:
``stickbreaking`` of sb_ref.py and ``ref_fwd`` of tests/test_attn.py, attend_current=False, the remainder added
to the query's own value): outputs and gradients, in float64."""

import math

import pytest
import torch
import torch.nn.functional as F


def reference(x, w_qkv, w_proj, n_heads, sign: float = 1.0):
    """The reference on x (B, T, D); ``sign=-1`` is a mutant that breaks the stick from the farthest key."""
    B, T, D = x.shape
    q, k, v = (x @ w.T for w in w_qkv.chunk(3))
    q, k, v = (t.view(B, T, n_heads, D // n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
    cm = torch.ones(T, T, dtype=x.dtype).tril(-1)
    if sign < 0:
        cm = cm.T
    mask = torch.ones(T, T).triu(0).bool()  # keys j >= i hidden
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    re_cum_log_beta = torch.einsum("bhij,jk->bhik", log_beta, cm)
    att = (log_z + re_cum_log_beta).exp()
    o = att @ v + (1 - att.sum(dim=-1))[..., None] * v
    return o.transpose(1, 2).reshape(B, T, D) @ w_proj.T


def outputs_and_grads(layer, plan, x, reference_pass: bool, sign: float = 1.0):
    weights = [layer.qkv.weight, layer.proj.weight]
    y = reference(x, *weights, n_heads=4, sign=sign) if reference_pass else layer(x, plan)
    seen = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=y.dtype)
    return y, torch.autograd.grad((y * seen).sum(), [x, *weights])


@pytest.mark.parametrize("seq_len", [16, 300])
def test_layer_equals_the_reference(content_layer, seq_len):
    layer, plan = content_layer("stickbreaking", seq_len)
    x = torch.randn(2, seq_len, 32, dtype=torch.float64, requires_grad=True)
    y, grads = outputs_and_grads(layer, plan, x, reference_pass=False)
    y_ref, grads_ref = outputs_and_grads(layer, plan, x, reference_pass=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-9)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9)


def test_the_comparison_sees_the_order_of_breaking(content_layer):
    layer, plan = content_layer("stickbreaking", 16)
    x = torch.randn(2, 16, 32, dtype=torch.float64, requires_grad=True)
    y, _ = outputs_and_grads(layer, plan, x, reference_pass=False)
    mutant, _ = outputs_and_grads(layer, plan, x, reference_pass=True, sign=-1.0)
    assert not torch.allclose(y, mutant, rtol=1e-6, atol=1e-6)


def test_weights_are_a_hand_worked_stick():
    """Three keys before the query with β = 1/2 each, and the query's own key: 1/2, 1/4, 1/8 from the nearest, and
    the 1/8 left over to the query itself."""
    from posbench.positional.stickbreaking import StickBreakingTerms

    terms = StickBreakingTerms()
    scores = torch.zeros(1, 1, 1, 4)  # σ(0) = 1/2 everywhere
    idx = torch.arange(4)
    weights = terms.weights(terms.logits(scores, torch.zeros(1, 1, 1, 4), None, None, None, idx[3:], idx))
    torch.testing.assert_close(weights[0, 0, 0], torch.tensor([1 / 8, 1 / 4, 1 / 2, 1 / 8]))
    hidden = torch.tensor([0.0, float("-inf"), 0.0, 0.0])  # a hidden key breaks nothing and gets nothing
    weights = terms.weights(terms.logits(scores, hidden.view(1, 1, 1, 4), None, None, None, idx[3:], idx))
    torch.testing.assert_close(weights[0, 0, 0], torch.tensor([1 / 4, 0.0, 1 / 2, 1 / 4]))
