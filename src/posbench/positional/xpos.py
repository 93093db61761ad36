"""xPos: Sun et al., 2022, "A Length-Extrapolatable Transformer" (arXiv:2212.10554).

RoPE whose rotation pair i is also scaled: queries at position n by ζ_i^(n/B), keys at m by
ζ_i^(−m/B), with ζ_i = (2i/d + 0.4)/1.4, so the logit of (n, m) carries ζ_i^((n−m)/B), a decay
with distance that is strongest for the fast-turning pairs. The decay needs n ≥ m: xPos is for
causal attention (for m > n the factor grows instead).

The paper's extrapolation results pair xPos with blockwise causal attention at inference: each
query attends to the keys of its own block and of the previous one, never to all of a long
sequence. That is not part of the encoding: it is ``eval.blockwise=W`` (``attention.py``), which
applies to any encoding. posbench's xPos rows are "xPos without blockwise attention" unless their
variant says ``blockwiseW``.

Positions in the scale are centred on the middle of the sequence, as in the authors'
torchscale code: q·k depends on n − m only, so the shift cancels, and it halves the largest
exponent: with B = 512, ζ_0^(±T/2B) stays inside the fp32 and bf16 range up to T ≈ 72k
positions, against ≈ 36k uncentred.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .base import Dimensions, EncodingConfig, PositionEncoding
from .rotary import per_head, rotary_angles, rotary_problems, rotate_pairs


def xpos_zeta(head_dim: int) -> Tensor:
    """ζ_i = (2i/d + 0.4)/1.4 for each rotation pair i < d/2, (head_dim/2,) fp32."""
    return (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim + 0.4) / 1.4


@dataclass
class XposConfig(EncodingConfig):
    name: str = "xpos"
    theta: float = 10000.0
    #: B in ζ^(n/B): larger is a gentler decay.
    scale_base: float = 512.0

    def problems(self, dims: Dimensions) -> list[str]:
        found = super().problems(dims) + rotary_problems(dims.head_dim, self.theta)
        if not self.scale_base > 0:
            found.append(f"encoding.scale_base must be positive, got {self.scale_base}")
        return found


class XPos(PositionEncoding):
    config_class = XposConfig
    rotates_per_pass = True  # the scale is centred on the pass's middle position

    def __init__(self, cfg: XposConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.head_dim, self.theta, self.scale_base = dims.head_dim, cfg.theta, cfg.scale_base

    def tables(self, positions: Tensor) -> tuple[Tensor, ...]:
        """cos and sin (T, hd/2) times the query scale, then times the key scale; (B, 1, T, hd/2) each for
        per-sequence positions (B, T)."""
        angles = rotary_angles(positions, self.head_dim, self.theta)  # (..., T, hd/2)
        centre = positions[..., positions.shape[-1] // 2, None]  # (..., 1): the middle token's position
        exponent = (positions - centre).float()[..., None] / self.scale_base  # (..., T, 1)
        scale = xpos_zeta(self.head_dim).to(positions.device) ** exponent  # (..., T, hd/2)
        cos, sin = angles.cos(), angles.sin()
        return tuple(per_head(t) for t in (cos * scale, sin * scale, cos / scale, sin / scale))

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        # A rotation scaled by s is (x1·cos − x2·sin, x1·sin + x2·cos)·s, so the scale rides on cos and sin.
        tables = self.for_positions(positions, self.tables)  # shared by all layers; never in checkpoints
        q_cos, q_sin, k_cos, k_sin = (t.to(q.dtype) for t in tables)
        q_cos, q_sin = q_cos[..., -q.shape[-2] :, :], q_sin[..., -q.shape[-2] :, :]  # the queries: the last positions
        return rotate_pairs(q, q_cos, q_sin), rotate_pairs(k, k_cos, k_sin)
