"""Learned absolute positions (GPT-2 style): one trained vector per position, up to ``max_positions``
(default: ``randomized_positions`` when set, else the training length)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor, nn

from .base import Dimensions, EncodingConfig, PositionEncoding


@dataclass
class LearnedConfig(EncodingConfig):
    name: str = "learned"
    #: Size of the position table; ``null``: ``randomized_positions`` when set, else the training length.
    max_positions: Optional[int] = None

    def problems(self, dims: Dimensions) -> list[str]:
        found, size, limit = super().problems(dims), self.max_positions, self.randomized_positions
        if size is not None and size < 1:
            found.append(f"encoding.max_positions must be positive or null, got {size}")
        elif size is not None and limit is not None and size < limit:
            found.append(f"encoding.max_positions={size} must be at least encoding.randomized_positions={limit}")
        return found


class Learned(PositionEncoding):
    config_class = LearnedConfig

    def __init__(self, cfg: LearnedConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.max_len = cfg.max_positions or cfg.randomized_positions or dims.train_len
        self.table = nn.Embedding(self.max_len, dims.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table.weight, std=0.02)  # GPT-2's position table, as its token embedding

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        seq_len = x.shape[1]
        if seq_len > self.max_len:
            raise ValueError(self.unsupported_reason(seq_len))
        return x + self.table(positions)  # (T, D) or (B, T, D)
