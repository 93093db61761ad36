import math

import pytest
import torch
from omegaconf import OmegaConf

from posbench.positional import apply_rope, build_encoding


def complex_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """RoFormer's formulation: adjacent pairs as complex numbers times exp(i * p * theta^(-2k/d))."""
    d = x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    rotation = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions.double()[:, None] * freqs)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2))
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


def test_interleaved_equals_complex_multiplication():
    x = torch.randn(2, 3, 10, 16)
    pos = torch.arange(10)
    torch.testing.assert_close(apply_rope(x, pos, interleaved=True), complex_rope(x, pos), atol=1e-5, rtol=1e-5)


def test_hand_computed_rotation():
    # head_dim 2: one pair, frequency 1, so position p rotates (1, 0) to (cos p, sin p)
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    out = apply_rope(x, torch.tensor([0, 1, 2]), interleaved=True)
    expected = torch.tensor([[1.0, 0.0], [math.cos(1), math.sin(1)], [-math.sin(2), math.cos(2)]])
    torch.testing.assert_close(out, expected)


def test_half_and_interleaved_differ_by_a_fixed_permutation():
    d = 16
    x = torch.randn(4, 12, d)
    pos = torch.arange(12)
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # interleaved pair k -> (k, k + d/2)
    torch.testing.assert_close(
        apply_rope(x[..., perm], pos, interleaved=False), apply_rope(x, pos, interleaved=True)[..., perm]
    )


@pytest.mark.parametrize("interleaved", [False, True])
def test_preserves_norms(interleaved):
    x = torch.randn(3, 50, 32)
    out = apply_rope(x, torch.arange(50), interleaved=interleaved)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("interleaved", [False, True])
def test_dot_product_depends_only_on_offset(interleaved):
    q, k = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)

    def score(m, n):
        rq = apply_rope(q[None], torch.tensor([m]), interleaved=interleaved)
        rk = apply_rope(k[None], torch.tensor([n]), interleaved=interleaved)
        return (rq * rk).sum().item()

    assert score(7, 3) == pytest.approx(score(107, 103), rel=1e-4)
    assert score(7, 3) == pytest.approx(score(1007, 1003), rel=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-3)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_module_matches_function_and_grows(layout):
    encoding = build_encoding(
        OmegaConf.create({"name": "rope", "layout": layout}), n_heads=2, head_dim=8, d_model=16, train_len=8
    )
    for length in (8, 40):  # the cached tables grow past the training length
        q, k = torch.randn(1, 2, length, 8), torch.randn(1, 2, length, 8)
        pos = torch.arange(length)
        rq, rk = encoding.rotate(q, k, pos)
        torch.testing.assert_close(rq, apply_rope(q, pos, interleaved=layout == "interleaved"))
        torch.testing.assert_close(rk, apply_rope(k, pos, interleaved=layout == "interleaved"))
    assert not encoding.state_dict()  # caches are not checkpointed


def test_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="even head dimension"):
        build_encoding(OmegaConf.create({"name": "rope"}), n_heads=2, head_dim=7, d_model=14, train_len=8)
