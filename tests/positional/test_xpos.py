import math

import pytest
import torch
from omegaconf import OmegaConf

from posbench.positional import build_encoding
from posbench.positional.xpos import xpos_zeta


def make(head_dim=8, **options):
    cfg = OmegaConf.create({"name": "xpos", **options})
    return build_encoding(cfg, n_heads=1, head_dim=head_dim, d_model=head_dim, train_len=16)


def reference_logit(
    q: torch.Tensor, k: torch.Tensor, n: int, m: int, scale_base: float, theta: float = 10000.0
) -> float:
    """xPos q_n·k_m with pair i = (x[i], x[i + d/2]) as a complex number, in float64:
    Σ_i ζ_i^((n−m)/B) Re(z_q,i · conj(z_k,i) · e^{i(n−m)θ_i}), θ_i = theta^(−2i/d)."""
    d = q.shape[-1]
    total = 0.0
    for i in range(d // 2):
        zeta = (2 * i / d + 0.4) / 1.4
        angle = (n - m) * theta ** (-2 * i / d)
        zq, zk = complex(q[i], q[i + d // 2]), complex(k[i], k[i + d // 2])
        total += zeta ** ((n - m) / scale_base) * (zq * zk.conjugate() * complex(math.cos(angle), math.sin(angle))).real
    return total


def test_zeta_hand_worked():
    expected = torch.tensor([0.4 / 1.4, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4])  # (2i/8 + 0.4)/1.4
    torch.testing.assert_close(xpos_zeta(8), expected)


def test_logits_match_reference():
    torch.manual_seed(0)
    T, d, B = 12, 8, 4.0  # a small B so the decay shows within a few positions
    q, k = torch.randn(1, 1, T, d, dtype=torch.float64), torch.randn(1, 1, T, d, dtype=torch.float64)
    qr, kr = make(head_dim=d, scale_base=B).rotate(q, k, torch.arange(T))
    logits = (qr @ kr.transpose(-2, -1))[0, 0]
    expected = torch.tensor(
        [[reference_logit(q[0, 0, n], k[0, 0, m], n, m, B) for m in range(T)] for n in range(T)], dtype=torch.float64
    )
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_logits_depend_on_distance_only():
    torch.manual_seed(1)
    x = torch.randn(1, 1, 1, 8).expand(1, 1, 10, 8)  # the same vector at every position
    qr, kr = make(scale_base=8.0).rotate(x, x, torch.arange(10))
    logits = (qr @ kr.transpose(-2, -1))[0, 0]
    for offset in range(-9, 10):
        diagonal = logits.diagonal(offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))


def test_sixteen_thousand_positions_stay_finite_and_exact():
    torch.manual_seed(2)
    T, d = 16384, 16
    q, k = torch.randn(1, 2, T, d), torch.randn(1, 2, T, d)
    qr, kr = make(head_dim=d).rotate(q, k, torch.arange(T))
    assert torch.isfinite(qr).all() and torch.isfinite(kr).all()
    for n, m in [(T - 1, 0), (T - 1, T - 4), (T // 2, 3), (5, 0)]:
        got = (qr[0, 1, n] @ kr[0, 1, m]).item()
        expected = reference_logit(q[0, 1, n].double(), k[0, 1, m].double(), n, m, 512.0)
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_odd_head_dim_raises():
    with pytest.raises(ValueError, match="even head dimension"):
        make(head_dim=7)


def test_sixty_four_thousand_positions_stay_finite_in_bf16():
    # Uncentred, keys at m = 65535 would be scaled by ζ_0^(−128) ≈ 1e69, past bf16's range.
    q = torch.randn(1, 1, 65536, 8, dtype=torch.bfloat16)
    qr, kr = make().rotate(q, q, torch.arange(65536))
    assert torch.isfinite(qr).all() and torch.isfinite(kr).all()
