"""DAPE against a transcription of its authors' forward pass over KERPLE (chuanyang-Zheng/DAPE,
``ParallelKerpleLog_C.forward`` inside GPT-NeoX's attention), in float64, on a short sequence and on a long one
that attention serves a few queries at a time."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from content_terms import terms_pass

from posbench import attention as attention_mod
from posbench.attention import Attention
from posbench.masks import causal_mask
from posbench.positional import build_encoding
from posbench.positional import dape as dape_module

H, HD, WIDTH = 3, 8, 16


def reference_kerple_dape(x, bias_p, bias_a, w1, b1, w2, b2):
    """The reference's logits, transcribed: x (B, H, L, L) GPT-NeoX's scaled scores q·kᵀ/√d before the mask;
    bias_p, bias_a (H, 1, 1) KERPLE's r1 and r2 (inside their bounds); the MLP 2H -> width -> H written out.
    Then GPT-NeoX's causal mask (-10000 where hidden) and softmax."""
    L = x.shape[-1]
    diff = torch.tril(torch.arange(L).view(L, 1).repeat(1, L) + torch.arange(0, -L, -1)).to(x.dtype)
    bias = -bias_p * torch.log(1 + bias_a * diff)  # (H, L, L)
    features = torch.cat((x, torch.tile(bias, (x.shape[0], 1, 1, 1))), dim=1).permute(0, 2, 3, 1)  # (B, L, L, 2H)
    correction = (F.leaky_relu(features @ w1.T + b1) @ w2.T + b2).permute(0, 3, 1, 2)  # (B, H, L, L)
    logits = x + bias + correction
    hidden = torch.ones(L, L, dtype=torch.bool).triu(1)
    return logits, logits.masked_fill(hidden, -10000.0).softmax(dim=-1)


def make(base="kerple_log", train_len=64):
    return build_encoding(
        {"name": "dape", "base": base, "mlp_width": WIDTH}, n_heads=H, head_dim=HD, d_model=H * HD, train_len=train_len
    )


def setup(T: int, base: str = "kerple_log", seed: int = 0):
    """posbench's encoding (KERPLE's r1, r2 drawn as it draws them) and one layer's terms in float64, and q, k, v
    (2, H, T, hd) float64 leaves."""
    torch.manual_seed(seed)
    encoding = make(base).double()
    terms = encoding.layer_terms().double()
    terms.reset_parameters()  # as the model leaves them: PyTorch's nn.Linear initialisation
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, H, T, HD, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    return encoding, terms, (q, k, v)


def reference_of(q, k, v, encoding, terms):
    x = q @ k.transpose(-1, -2) / math.sqrt(HD)  # GPT-NeoX: baddbmm with alpha 1/norm_factor
    r1, r2 = encoding.base.r1, encoding.base.r2
    first, second = terms.mlp[0], terms.mlp[2]
    logits, weights = reference_kerple_dape(
        x, r1[:, None, None], r2[:, None, None], first.weight, first.bias, second.weight, second.bias
    )
    return logits, weights, weights @ v


#: posbench builds every mask in fp32, the static bias in it (masks.causal_mask), so KERPLE's bias and its
#: gradient carry fp32 rounding: equal to 1e-6, not to float64's 1e-12 (CoPE, with no static bias, is to 1e-12).
TOLERANCE = 1e-6


def assert_equal_to_the_reference(T: int, tolerance: float = TOLERANCE):
    encoding, terms, (q, k, v) = setup(T)
    ours = terms_pass(q, k, v, encoding, terms)  # first: posbench clamps KERPLE's parameters in place
    theirs = reference_of(q, k, v, encoding, terms)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.isneginf(ours[0][..., ~visible]).all()
    torch.testing.assert_close(ours[0][..., visible], theirs[0][..., visible], rtol=tolerance, atol=tolerance)
    for mine, reference in zip(ours[1:], theirs[1:]):  # the weights, the output
        torch.testing.assert_close(mine, reference, rtol=tolerance, atol=tolerance)
    leaves = (q, k, v, encoding.base.r1, encoding.base.r2, *terms.parameters())
    grad_out = torch.randn_like(v)
    ours_grads = torch.autograd.grad((ours[2] * grad_out).sum(), leaves)
    theirs_grads = torch.autograd.grad((theirs[2] * grad_out).sum(), leaves)
    names = ["q", "k", "v", "r1", "r2", *(name for name, _ in terms.named_parameters())]
    for name, mine, reference in zip(names, ours_grads, theirs_grads):
        assert reference.abs().sum() > 0, name
        torch.testing.assert_close(mine, reference, rtol=tolerance, atol=tolerance, msg=name)


@pytest.mark.parametrize("T, block", [(16, None), (300, 7)])
def test_logits_weights_output_and_gradients_equal_the_reference(T, block, monkeypatch):
    """16 tokens on the full mask; 300 tokens 7 queries at a time; two sequences, so that the static bias (one
    for the batch) meets scores of each."""
    if block is not None:
        factor = make().logit_memory_factor  # the content path's blocks are this many times smaller
        monkeypatch.setattr(attention_mod, "MASK_BUDGET", math.ceil(4 * factor * H * T * block))
        assert Attention("auto", make()).plan(T, torch.device("cpu"), True, 0.0).query_block == block
    assert_equal_to_the_reference(T)


ORIGINAL_CORRECTION = dape_module.dape_correction
MUTANTS = {
    "inputs swapped": lambda s, b, mlp: ORIGINAL_CORRECTION(b.expand_as(s), s, mlp),
    "no residual bias": lambda s, b, mlp: ORIGINAL_CORRECTION(s, b, mlp) - b,
    "sign": lambda s, b, mlp: -ORIGINAL_CORRECTION(s, b, mlp),
    "ReLU": lambda s, b, mlp: ORIGINAL_CORRECTION(s, b, torch.nn.Sequential(mlp[0], torch.nn.ReLU(), mlp[2])),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_reference_check_fails_when_a_detail_of_the_formula_changes(mutant, monkeypatch):
    monkeypatch.setattr(dape_module, "dape_correction", MUTANTS[mutant])
    with pytest.raises(AssertionError):
        assert_equal_to_the_reference(16)


def test_the_static_bias_is_the_base_encodings_and_the_mlp_is_per_layer(tiny_lm):
    lm = tiny_lm("dape", train_len=64)
    kerple = build_encoding({"name": "kerple_log"}, n_heads=4, head_dim=8, d_model=32, train_len=64)
    kerple.load_state_dict({name[len("base.") :]: p for name, p in lm.encoding.state_dict().items()})
    pos = torch.arange(10)
    torch.testing.assert_close(lm.encoding.bias(pos, pos), kerple.bias(pos, pos), rtol=0, atol=0)
    first, second = (block.attn.terms.mlp for block in lm.blocks)
    assert first[0].weight.shape == (32, 8) and second[2].weight.shape == (4, 32)  # 2H -> 32 -> H
    assert not torch.equal(first[0].weight, second[0].weight)
    bound = 1 / math.sqrt(8)  # nn.Linear's U(±1/√fan_in), not the model's GPT-2 std 0.02
    assert first[0].weight.abs().max() <= bound and first[0].weight.std() > 0.1
    assert (first[0].bias != 0).all()


@pytest.mark.parametrize("base", ["alibi", "fire"])
def test_other_static_biases_under_the_mlp(base):
    """The same residual form over any static bias: logits = S + B + f([S, B])."""
    encoding, terms, (q, k, v) = setup(12, base)
    idx = torch.arange(12)
    bias = encoding.base.bias(idx, idx).double()[None]  # (1, H, T, T)
    scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
    first, second = terms.mlp[0], terms.mlp[2]
    features = torch.cat([scores, bias.expand_as(scores)], dim=1).permute(0, 2, 3, 1)
    correction = F.leaky_relu(features @ first.weight.T + first.bias) @ second.weight.T + second.bias  # (B, T, T, H)
    expected = scores + bias + correction.permute(0, 3, 1, 2)
    logits = terms.logits(scores, causal_mask(encoding, idx, idx), q, k, None, idx, idx)
    visible = torch.ones(12, 12, dtype=torch.bool).tril()
    torch.testing.assert_close(logits[..., visible], expected[..., visible], rtol=TOLERANCE, atol=TOLERANCE)


def test_base_and_width_rules():
    with pytest.raises(ValueError, match=r"encoding\.base must be one of alibi, fire, kerple_log, .*got 'rope'"):
        make(base="rope")
    with pytest.raises(ValueError, match=r"encoding\.mlp_width must be positive, got 0"):
        build_encoding({"name": "dape", "mlp_width": 0}, n_heads=H, head_dim=HD, d_model=H * HD, train_len=16)
