"""What the rotary encodings (RoPE, xPos) share: the base frequencies and the rotation itself.

Both rules of a rotary encoding live here (``rotary_problems``): an even head dimension (dimensions turn in pairs)
and a positive base ``theta`` (otherwise the frequencies are NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_problems(head_dim: int, theta: float) -> list[str]:
    """The two rules of a rotary encoding, for its config's ``problems``."""
    found = []
    if head_dim % 2:
        found.append(f"rotary encodings need an even head dimension (model.d_model / model.n_heads), got {head_dim}")
    if not theta > 0:
        found.append(f"encoding.theta must be positive, got {theta}")
    return found


def rotary_inv_freq(head_dim: int, theta: float) -> Tensor:
    """theta^(-2i/d) for each rotation pair i < d/2, (head_dim/2,) fp32 (the rules: ``rotary_problems``)."""
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


def rotary_angles(positions: Tensor, head_dim: int, theta: float = 10000.0) -> Tensor:
    """Rotation angles (..., T, head_dim/2) in fp32 of integer ``positions`` (..., T)."""
    inv_freq = rotary_inv_freq(head_dim, theta).to(positions.device)
    return positions.to(torch.float32)[..., None] * inv_freq


def per_head(table: Tensor) -> Tensor:
    """A table of positions (T,), shape (T, X), as it is; one of per-sequence positions (B, T), shape
    (B, T, X), as (B, 1, T, X): either broadcasts over the heads of q and k (B, H, T, hd)."""
    return table if table.dim() == 2 else table.unsqueeze(-3)


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotate the dimension pairs of x (..., T, hd) by angles whose cos and sin are (T, hd/2) (or broadcast to x).

    ``interleaved``: pairs (2i, 2i+1), the complex-number formulation; otherwise (i, i + d/2),
    ``rotate_half`` as in GPT-NeoX and Llama.
    """
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
