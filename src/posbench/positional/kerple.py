"""KERPLE: Chi et al., 2022, "Kernelized Relative Positional Embedding for Length Extrapolation" (arXiv:2205.09921).

Two conditionally positive definite kernels of the distance |i − j|, each with two learned
scalars per head:

* ``kerple_log``: −r1 · log(1 + r2 · |i − j|), with r1, r2 ≥ 0.01;
* ``kerple_power``: −a · |i − j|^p, with a ≥ 0.01 and 0.01 ≤ p ≤ 2.

Initialisation and bounds follow the authors' code (github.com/chijames/KERPLE,
``ParallelKerpleLog`` and the power variant beside it): the outer scale (r1, resp. the
exponent p) uniform in (0, 2), the inner one (r2, resp. a) uniform in (0, 1), eps = 1e-2.
So does the way the bounds hold: before each use the stored parameters are clamped in place
(``bounded``), so a parameter that an optimizer step pushes past a bound starts again from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import Dimensions, EncodingConfig, PositionEncoding

#: Lower bound of every KERPLE parameter (the reference code's eps).
FLOOR = 1e-2


def bounded(p: nn.Parameter, low: float, high: float | None = None) -> Tensor:
    """``p`` with its stored values clamped into [low, high] in place first, as the reference does
    before each use (``param.data = param.data.clamp(...)``): pushed past a bound, a parameter sits
    on it and its next step starts from there, with the kernel's gradient at the bound.

    Compiled code (FlexAttention's score_mod) cannot write to a parameter: there the clamp is
    straight-through (the same values, the identity's gradient), and the next eager use resets
    the stored values.
    """
    if torch.compiler.is_compiling():
        return p.detach().clamp(low, high) + (p - p.detach())  # the second term: exactly 0, gradient 1
    p.data.clamp_(low, high)  # .data: unseen by autograd, so uses earlier in this pass stay valid
    return p


def uniform_per_head(n_heads: int, high: float) -> nn.Parameter:
    return nn.Parameter(torch.rand(n_heads) * high)  # (H,)


@dataclass
class KerpleLogConfig(EncodingConfig):
    name: str = "kerple_log"


class KerpleLog(PositionEncoding):
    config_class = KerpleLogConfig

    def __init__(self, cfg: KerpleLogConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.r1, self.r2 = uniform_per_head(dims.n_heads, 2.0), uniform_per_head(dims.n_heads, 1.0)

    def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        r1, r2 = bounded(self.r1, FLOOR)[head], bounded(self.r2, FLOOR)[head]
        return -r1 * torch.log1p(r2 * (q_pos - k_pos).abs())


@dataclass
class KerplePowerConfig(EncodingConfig):
    name: str = "kerple_power"


class KerplePower(PositionEncoding):
    config_class = KerplePowerConfig

    def __init__(self, cfg: KerplePowerConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.a, self.p = uniform_per_head(dims.n_heads, 1.0), uniform_per_head(dims.n_heads, 2.0)

    def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        a, p = bounded(self.a, FLOOR)[head], bounded(self.p, FLOOR, 2.0)[head]
        return -a * (q_pos - k_pos).abs() ** p
