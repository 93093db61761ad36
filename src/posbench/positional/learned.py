"""Learned absolute positions (GPT-2 style): one trained vector per position, up to ``max_positions``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .base import PositionEncoding


@dataclass
class LearnedConfig:
    name: str = "learned"
    #: Size of the position table; ``null`` means the training length.
    max_positions: Optional[int] = None


class Learned(PositionEncoding):
    def __init__(self, cfg: LearnedConfig, d_model: int, train_len: int, n_heads: int, **_):
        super().__init__(n_heads)
        self.max_len = cfg.max_positions or train_len
        self.table = nn.Embedding(self.max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def embed(self, x: Tensor) -> Tensor:
        seq_len = x.shape[1]
        if seq_len > self.max_len:
            raise ValueError(self.unsupported_reason(seq_len))
        return x + self.table(torch.arange(seq_len, device=x.device))
