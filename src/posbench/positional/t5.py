"""T5 relative bias: Raffel et al., 2020, "Exploring the Limits of Transfer Learning" (arXiv:1910.10683).

Each head adds a learned scalar per bucket of the relative position key − query: one bucket
per distance below ``num_buckets/2``, log-spaced buckets up to ``max_distance``, and every
longer distance shares the last bucket, so any length can be served.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import Dimensions, EncodingConfig, PositionEncoding


def t5_bucket(
    relative_position: Tensor, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False
) -> Tensor:
    """Bucket ids (LongTensor, same shape) of ``relative_position = key_pos − query_pos``.

    The T5 reference ``_relative_position_bucket`` (mesh-tensorflow, Hugging Face T5).
    Causal (``bidirectional=False``): keys after the query all fall in bucket 0. Bidirectional:
    half the buckets for keys before the query, half (offset by ``num_buckets/2``) for keys after.
    """
    rel = torch.as_tensor(relative_position)
    if bidirectional:
        num_buckets //= 2
        offset = (rel > 0).long() * num_buckets
        distance = rel.abs()
    else:
        offset = 0
        distance = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(
            f"t5 buckets need num_buckets >= {4 if bidirectional else 2} and max_distance > {max_exact}, "
            f"got num_buckets={num_buckets * (2 if bidirectional else 1)}, max_distance={max_distance}"
        )
    # Log-spaced beyond max_exact, in fp32 and in the reference's order of operations, so that
    # truncation lands on the same side at every bucket edge. The clamp only keeps log(0) out
    # of the branch that torch.where discards.
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return offset + torch.where(distance < max_exact, distance.long(), large)


@dataclass
class T5Config(EncodingConfig):
    name: str = "t5"
    num_buckets: int = 32
    #: Distances from here on share the last bucket.
    max_distance: int = 128

    def problems(self, dims: Dimensions) -> list[str]:
        try:  # t5_bucket owns the bucketing's rule: it refuses the two numbers together
            t5_bucket(torch.tensor(0), self.num_buckets, self.max_distance)
        except ValueError as e:
            return [*super().problems(dims), f"encoding.num_buckets, encoding.max_distance: {e}"]
        return super().problems(dims)


class T5Bias(PositionEncoding):
    config_class = T5Config

    def __init__(self, cfg: T5Config, dims: Dimensions):
        super().__init__(cfg, dims)
        self.num_buckets, self.max_distance = cfg.num_buckets, cfg.max_distance
        # std d_model^-0.5 as in Hugging Face T5's _init_weights.
        self.table = nn.Parameter(torch.randn(cfg.num_buckets, dims.n_heads) * dims.d_model**-0.5)  # (buckets, H)

    def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.table[t5_bucket(k_pos - q_pos, self.num_buckets, self.max_distance), head]
