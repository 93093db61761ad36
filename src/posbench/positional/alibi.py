"""ALiBi: Press et al., 2022, "Train Short, Test Long" (arXiv:2108.12409).

Each head h adds -m_h * (i - j) to the logit of query i and key j. No embedding is
added to the tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import Dimensions, EncodingConfig, PositionEncoding


def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head slopes (n_heads,) as in the paper's reference code.

    For n a power of two: the geometric series with start and ratio 2^(-8/n).
    Otherwise: the slopes for c = the nearest lower power of two, followed by the
    even-indexed slopes (0, 2, 4, ...) of the 2c-head series until there are n.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (k + 1) for k in range(n)]

    c = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(c)
    if c < n_heads:
        slopes += power_of_two(2 * c)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, q_len: int, k_len: int | None = None) -> Tensor:
    """ALiBi logit bias (n_heads, q_len, k_len); queries are the last q_len of k_len positions."""
    k_len = q_len if k_len is None else k_len
    k_pos = torch.arange(k_len)
    q_pos = k_pos[k_len - q_len :]
    return -alibi_slopes(n_heads)[:, None, None] * (q_pos[:, None] - k_pos[None, :])


@dataclass
class AlibiConfig(EncodingConfig):
    name: str = "alibi"
    #: Train the slopes (initialised from the reference values) instead of fixing them.
    learned_slopes: bool = False


class ALiBi(PositionEncoding):
    config_class = AlibiConfig

    def __init__(self, cfg: AlibiConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        slopes = alibi_slopes(dims.n_heads)
        if cfg.learned_slopes:
            self.slopes = nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes, persistent=False)

    def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return -self.slopes[head] * (q_pos - k_pos)
