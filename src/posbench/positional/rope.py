"""RoPE: Su et al., 2021, "RoFormer" (arXiv:2104.09864).

Pairs of head dimensions are rotated by position-dependent angles p * theta^(-2i/d).
Two layouts pair the dimensions differently:

* ``interleaved``: adjacent dimensions (2i, 2i+1), the complex-number formulation;
* ``half``: dimensions (i, i + d/2), ``rotate_half`` as in GPT-NeoX and Llama.

They are the same rotation up to a fixed permutation of head dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .base import PositionEncoding


def rope_angles(positions: Tensor, head_dim: int, theta: float = 10000.0) -> Tensor:
    """Rotation angles (seq, head_dim/2) in fp32."""
    if head_dim % 2:
        raise ValueError(f"rotary encodings need an even head dimension, got {head_dim}")
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return positions.to(torch.float32)[:, None] * inv_freq[None, :]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """Rotate x (..., T, hd) by angles whose cos/sin are (T, hd/2)."""
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def apply_rope(x: Tensor, positions: Tensor, theta: float = 10000.0, interleaved: bool = False) -> Tensor:
    """Rotary position embedding of x (..., seq, head_dim) at integer ``positions`` (seq,)."""
    angles = rope_angles(positions.to(x.device), x.shape[-1], theta)
    return _rotate(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), interleaved)


@dataclass
class RopeConfig:
    name: str = "rope"
    theta: float = 10000.0
    layout: str = "half"  # "half" (rotate_half, NeoX/Llama) or "interleaved" (complex pairs)


class RoPE(PositionEncoding):
    def __init__(self, cfg: RopeConfig, head_dim: int, n_heads: int, **_):
        super().__init__(n_heads)
        if cfg.layout not in ("half", "interleaved"):
            raise ValueError(f"rope.layout must be 'half' or 'interleaved', got {cfg.layout!r}")
        if head_dim % 2:
            raise ValueError(f"rotary encodings need an even head dimension, got {head_dim}")
        self.head_dim, self.theta, self.interleaved = head_dim, cfg.theta, cfg.layout == "interleaved"
        self.register_buffer("cos", torch.empty(0, head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(0, head_dim // 2), persistent=False)

    def _tables(self, seq_len: int, device: torch.device) -> tuple[Tensor, Tensor]:
        # Grown on demand (doubling), shared by all layers; never stored in checkpoints.
        if self.cos.shape[0] < seq_len or self.cos.device != device:
            n = max(seq_len, 2 * self.cos.shape[0])
            angles = rope_angles(torch.arange(n, device=device), self.head_dim, self.theta)
            self.cos, self.sin = angles.cos(), angles.sin()
        return self.cos[:seq_len], self.sin[:seq_len]

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self._tables(q.shape[-2], q.device)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return _rotate(q, cos, sin, self.interleaved), _rotate(k, cos, sin, self.interleaved)
