"""RoPE context extension: rope_inv_freq against closed forms, and the scaled module against plain RoPE."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from posbench.positional import apply_rope, build_encoding, rope_inv_freq
from posbench.positional.rope import scaling_label

D, THETA = 16, 10000.0
TWO_I = torch.arange(0, D, 2, dtype=torch.float64)  # 2i


def plain(theta: float = THETA) -> torch.Tensor:
    return (theta ** (-TWO_I / D)).float()


def test_no_scaling_is_plain_rope():
    inv, scale = rope_inv_freq(D, THETA)
    torch.testing.assert_close(inv, plain())
    assert scale == 1.0


@pytest.mark.parametrize("factor", [4.0, 16.0])
def test_linear_divides_every_frequency(factor):
    inv, scale = rope_inv_freq(D, THETA, {"type": "linear", "factor": factor})
    torch.testing.assert_close(inv, plain() / factor)
    assert scale == 1.0


@pytest.mark.parametrize("factor", [4.0, 16.0])
def test_static_ntk_raises_the_base(factor):
    inv, scale = rope_inv_freq(D, THETA, {"type": "ntk", "factor": factor})
    torch.testing.assert_close(inv, plain(THETA * factor ** (D / (D - 2))))
    assert scale == 1.0
    # the lowest frequency ends up divided by exactly the factor, the highest untouched
    assert inv[-1].item() == pytest.approx(plain()[-1].item() / factor, rel=1e-5)
    assert inv[0].item() == 1.0


def test_dynamic_ntk_changes_nothing_up_to_the_original_length_then_grows_the_base():
    scaling = {"type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 256}
    for seq_len in (None, 100, 256):
        torch.testing.assert_close(rope_inv_freq(D, THETA, scaling, seq_len=seq_len)[0], plain())
    # at L = 2 * L0: base * (4 * 2 - 3)^(d/(d-2)) = base * 5^(16/14)
    torch.testing.assert_close(rope_inv_freq(D, THETA, scaling, seq_len=512)[0], plain(THETA * 5 ** (16 / 14)))


def test_yarn_against_hand_worked_ramp():
    # d=16, theta=1e4, L0=256, beta_fast=32, beta_slow=1:
    #   low  = floor(16 ln(256 / (32 * 2pi)) / (2 ln 1e4)) = floor(0.210) = 0
    #   high = ceil (16 ln(256 / (1 * 2pi))  / (2 ln 1e4)) = ceil (3.220) = 4
    # so frequency i is interpolated by the weight min(i / 4, 1).
    factor = 4.0
    inv, scale = rope_inv_freq(D, THETA, {"type": "yarn", "factor": factor, "original_max_position_embeddings": 256})
    weight = torch.tensor([0, 0.25, 0.5, 0.75, 1, 1, 1, 1])
    torch.testing.assert_close(inv, plain() * (1 - weight) + plain() / factor * weight)
    assert scale == pytest.approx(0.1 * math.log(factor) + 1)


def test_yarn_options():
    base = {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256}
    assert rope_inv_freq(D, THETA, dict(base, attention_factor=1.0))[1] == 1.0
    assert rope_inv_freq(D, THETA, base)[1] == pytest.approx(0.1 * math.log(16) + 1)
    # beta_slow so small that no frequency completes that few turns: none interpolated fully
    wide, _ = rope_inv_freq(D, THETA, dict(base, beta_fast=1e6, beta_slow=1e-6))
    assert (wide > plain() / 16).all() and wide[0].item() == 1.0


@pytest.mark.parametrize(
    "bad", [{"type": "nope", "factor": 2.0}, {"type": "linear", "factor": 0.5}, {"type": "yarn", "factor": 2.0}]
)
def test_bad_scaling_is_rejected(bad):
    with pytest.raises(ValueError):
        rope_inv_freq(D, THETA, bad)


def make_rope(train_len=32, **scaling):
    cfg = OmegaConf.create({"name": "rope", "theta": THETA, "layout": "half", "scaling": scaling})
    return build_encoding(cfg, n_heads=2, head_dim=D, d_model=2 * D, train_len=train_len)


def test_linear_scaling_is_position_interpolation():
    # rotating position p with frequencies / s is rotating position p / s with the plain ones
    enc = make_rope(type="linear", factor=4.0)
    q = torch.randn(1, 2, 40, D)
    rotated, _ = enc.rotate(q, q, torch.arange(40))
    torch.testing.assert_close(rotated, apply_rope(q, torch.arange(40) / 4.0), atol=1e-5, rtol=1e-5)


def test_yarn_attention_factor_scales_logits_by_its_square():
    # as in transformers, the factor multiplies cos and sin, i.e. both q and k
    enc, plain_enc = make_rope(type="yarn", factor=16.0), make_rope()
    q, k = torch.randn(1, 2, 8, D), torch.randn(1, 2, 8, D)
    sq, sk = enc.rotate(q, k, torch.arange(8))
    pq, pk = plain_enc.rotate(q, k, torch.arange(8))
    # position 0 is not rotated, so only the scale differs there
    mscale = 0.1 * math.log(16) + 1
    torch.testing.assert_close(
        (sq[..., 0, :] * sk[..., 0, :]).sum(-1), mscale**2 * (pq[..., 0, :] * pk[..., 0, :]).sum(-1)
    )


def test_original_length_defaults_to_training_length():
    enc = make_rope(train_len=64, type="yarn", factor=4.0)
    assert enc.scaling["original_max_position_embeddings"] == 64


def test_dynamic_tables_follow_the_sequence_length():
    enc = make_rope(train_len=8, type="dynamic", factor=4.0)
    q = torch.randn(1, 1, 16, D)
    long, _ = enc.rotate(q, q, torch.arange(16))
    short, _ = enc.rotate(q[..., :8, :], q[..., :8, :], torch.arange(8))  # within L0: plain RoPE again
    torch.testing.assert_close(short, apply_rope(q[..., :8, :], torch.arange(8)))
    inv = plain(THETA * (4 * 16 / 8 - 3) ** (D / (D - 2)))
    angles = torch.arange(16)[:, None] * inv[None, :]
    half = torch.cat([angles, angles], -1)
    x1, x2 = q.chunk(2, -1)
    expected = q * half.cos() + torch.cat([-x2, x1], -1) * half.sin()
    torch.testing.assert_close(long, expected, atol=1e-5, rtol=1e-5)


def test_variant_labels():
    assert scaling_label(None) == "" and scaling_label({"type": None}) == ""
    assert scaling_label({"type": "yarn", "factor": 4.0}) == "yarn×4"
    assert scaling_label({"type": "linear", "factor": 2.5}) == "linear×2.5"
