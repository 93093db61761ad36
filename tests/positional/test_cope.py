"""CoPE against a transcription of its authors' forward pass (facebookresearch/RAM, projects/cope,
``ContextPosSelfAttn.forward`` with its default options), in float64, on a short sequence and on a long one
that attention serves a few queries at a time."""

from __future__ import annotations

import math

import pytest
import torch
from content_terms import terms_pass

from posbench import attention as attention_mod
from posbench.attention import Attention
from posbench.masks import causal_mask
from posbench.positional import build_encoding
from posbench.positional import cope as cope_module

H, HD = 2, 8


def reference_cope(query, key, val, pos_emb, npos: int):
    """The reference's forward pass, transcribed: query, key, val (B·H, L, hd) with the heads folded into the
    batch as it does; pos_emb (1, hd, npos), one table for every head; the causal mask multiplicative (0/1).
    Returns the logits (with log(mask) added: -inf where hidden), the attention weights and the output."""
    L, d = key.shape[1], key.shape[2]
    attn_mask = torch.ones(L, L, dtype=query.dtype).tril()[None]  # (1, L, L)
    gate_logits = query @ key.transpose(-1, -2)  # (BH, L, L)
    gates = torch.sigmoid(gate_logits / math.sqrt(d)) * attn_mask
    positions = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=npos - 1)
    pos_logits_fixed = query @ pos_emb  # (BH, L, npos)
    floor, ceil = positions.floor().long(), positions.ceil().long()
    ceil_weight = positions - floor
    pos_logits = pos_logits_fixed.gather(-1, ceil) * ceil_weight + pos_logits_fixed.gather(-1, floor) * (
        1 - ceil_weight
    )
    attn_logits = (gate_logits + pos_logits) / math.sqrt(d) + attn_mask.log()
    attn = attn_logits.softmax(dim=-1)
    return attn_logits, attn, attn @ val


def make(npos_max=None, train_len=64):
    options = {"name": "cope"} if npos_max is None else {"name": "cope", "npos_max": npos_max}
    return build_encoding(options, n_heads=H, head_dim=HD, d_model=H * HD, train_len=train_len)


def setup(T: int, npos: int, seed: int = 0):
    """posbench's encoding and one layer's terms, its table drawn at random, and q, k, v (1, H, T, hd): float64
    leaves, q and k scaled so that the gates spread over (0, 1) rather than sit near 1/2."""
    encoding = make(npos_max=npos)
    terms = encoding.layer_terms().double()
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, HD, generator=gen, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        terms.embeddings.copy_(torch.randn(npos, HD, generator=gen, dtype=torch.float64))
    return encoding, terms, [t.requires_grad_() for t in (1.5 * q, 1.5 * k, v)]


def reference_of(q, k, v, table, npos):
    fold = [t.reshape(H, *t.shape[2:]) for t in (q, k, v)]  # (1, H, T, hd) -> (H, T, hd)
    logits, weights, out = reference_cope(*fold, table.T[None], npos)
    return logits.view(1, H, *logits.shape[1:]), weights.view(1, H, *weights.shape[1:]), out.view_as(q)


def assert_equal_to_the_reference(T: int, npos: int, tolerance: float = 1e-12):
    encoding, terms, (q, k, v) = setup(T, npos)
    ours, theirs = terms_pass(q, k, v, encoding, terms), reference_of(q, k, v, terms.embeddings, npos)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.isneginf(ours[0][..., ~visible]).all()
    torch.testing.assert_close(ours[0][..., visible], theirs[0][..., visible], rtol=tolerance, atol=tolerance)
    for mine, reference in zip(ours[1:], theirs[1:]):  # the weights, the output
        torch.testing.assert_close(mine, reference, rtol=tolerance, atol=tolerance)
    leaves = (q, k, v, terms.embeddings)
    grad_out = torch.randn_like(v)
    ours_grads = torch.autograd.grad((ours[2] * grad_out).sum(), leaves)
    theirs_grads = torch.autograd.grad((theirs[2] * grad_out).sum(), leaves)
    for name, mine, reference in zip("qkve", ours_grads, theirs_grads):
        assert reference.abs().sum() > 0, name
        torch.testing.assert_close(mine, reference, rtol=tolerance, atol=tolerance, msg=name)


@pytest.mark.parametrize("T, npos, block", [(16, 8, None), (300, 24, 7)])
def test_logits_weights_output_and_gradients_equal_the_reference(T, npos, block, monkeypatch):
    """16 tokens on the full mask; 300 tokens 7 queries at a time. The cap (npos − 1) and the interpolation
    both act: some positions reach the cap, others fall between integers."""
    if block is not None:
        factor = make().logit_memory_factor  # the content path's blocks are this many times smaller
        monkeypatch.setattr(attention_mod, "MASK_BUDGET", math.ceil(4 * factor * H * T * block))
        assert Attention("auto", make(npos_max=npos)).plan(T, torch.device("cpu"), True, 0.0).query_block == block
    encoding, terms, (q, k, v) = setup(T, npos)
    hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
    positions = cope_module.contextual_positions(q @ k.transpose(-1, -2) / math.sqrt(HD), hidden, npos)[..., ~hidden]
    assert (positions == npos - 1).any() and (positions < npos - 2).any() and (positions % 1 != 0).any()
    assert_equal_to_the_reference(T, npos)


def exclusive_positions(scores, hidden, npos_max):
    """The boundary moved: p_ij = Σ_{k=j+1..i} (key j itself not counted)."""
    gates = scores.sigmoid().masked_fill(hidden, 0.0)
    return (gates.flip(-1).cumsum(-1).flip(-1) - gates).clamp(max=npos_max - 1)


def forward_positions(scores, hidden, npos_max):
    """The sum run the wrong way: from the first key up to j, not from j up to the query."""
    gates = scores.sigmoid().masked_fill(hidden, 0.0)
    return gates.cumsum(-1).clamp(max=npos_max - 1)


def swapped_interpolation(q, embeddings, positions):
    """floor and ceiling trade weights."""
    mirrored = positions.floor() + positions.ceil() - positions
    return ORIGINAL_INTERPOLATION(q, embeddings, mirrored)


ORIGINAL_INTERPOLATION = cope_module.interpolated_logits
MUTANTS = {
    "boundary": ("contextual_positions", exclusive_positions),
    "direction": ("contextual_positions", forward_positions),
    "interpolation": ("interpolated_logits", swapped_interpolation),
    "sign": ("interpolated_logits", lambda q, e, p: -ORIGINAL_INTERPOLATION(q, e, p)),
    "sqrt(d)": ("interpolated_logits", lambda q, e, p: ORIGINAL_INTERPOLATION(q, e, p) * math.sqrt(HD)),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_reference_check_fails_when_a_detail_of_the_formula_changes(mutant, monkeypatch):
    monkeypatch.setattr(cope_module, *MUTANTS[mutant])
    with pytest.raises(AssertionError):
        assert_equal_to_the_reference(16, 8)


def test_one_table_per_layer_shared_by_the_heads_starting_at_zero(tiny_lm):
    lm = tiny_lm("cope", train_len=64)
    tables = [block.attn.terms.embeddings for block in lm.blocks]
    assert [t.shape for t in tables] == [(8, 32 // 4)] * 2  # npos_max = 64 / 8; (npos, head_dim): no head axis
    assert all((t == 0).all() for t in tables) and tables[0] is not tables[1]
    assert not any(p.requires_grad for p in lm.encoding.parameters())  # nothing static: no bias, no rotation
    assert not lm.encoding.has_bias and lm.encoding.embed(torch.ones(1, 2, 3), torch.arange(2)).eq(1).all()


def test_npos_max_rules():
    assert make(train_len=256).npos_max == 32 and make(npos_max=5).npos_max == 5
    with pytest.raises(ValueError, match=r"encoding\.npos_max must be at least 2 \(positions 0 and 1\), got 1"):
        make(npos_max=1)


def test_keys_past_the_cap_for_every_query_take_the_capped_term_even_after_a_run_of_shut_gates():
    """A block of the last 10 of 600 queries, after 290 keys whose gates are all but shut: the newest keys tried
    first do not reach the cap, so the keys counted must widen past the shut run before the older ones may take
    the capped term; the logits still equal the reference's."""
    T, npos, Q = 600, 8, 10
    encoding, terms, (q, k, v) = setup(T, npos)
    q, k = q.detach().clone(), k.detach().clone()
    q[..., 0] = 3.0  # every query reads dimension 0 ...
    k[..., 300 : T - Q, 0] = -20.0  # ... where these keys shut its gate: σ(≈ -21) ≈ 1e-9
    idx = torch.arange(T)
    scores = q[:, :, -Q:] @ k.transpose(-1, -2) / math.sqrt(HD)
    bias = causal_mask(encoding, idx[-Q:], idx)
    start, _ = terms.counted(scores, bias)
    assert 0 < start < 300  # widened past the shut run, and still spared the oldest keys
    with torch.no_grad():
        ours = terms.logits(scores, bias, q[:, :, -Q:], k, None, idx[-Q:], idx)
        theirs = reference_of(q, k, v, terms.embeddings, npos)[0][:, :, -Q:]
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
