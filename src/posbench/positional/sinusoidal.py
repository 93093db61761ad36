"""Sinusoidal absolute positions: Vaswani et al., 2017, "Attention Is All You Need"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import Dimensions, PositionEncoding


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)); shape (n, d)."""
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]
    div = 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position / div)
    table[:, 1::2] = torch.cos(position / div)[:, : d_model // 2]
    return table


@dataclass
class SinusoidalConfig:
    name: str = "sinusoidal"
    #: Multiply token embeddings by sqrt(d_model) before adding the table, as in the
    #: Transformer paper and fairseq; otherwise the unit-amplitude table drowns them.
    scale_embeddings: bool = True


class Sinusoidal(PositionEncoding):
    config_class = SinusoidalConfig

    def __init__(self, cfg: SinusoidalConfig, dims: Dimensions):
        super().__init__(dims)
        self.d_model = dims.d_model
        self.scale = math.sqrt(dims.d_model) if cfg.scale_embeddings else 1.0
        self.register_buffer("table", torch.empty(0, dims.d_model), persistent=False)

    def embed(self, x: Tensor) -> Tensor:
        seq_len = x.shape[1]
        if self.table.shape[0] < seq_len or self.table.device != x.device:
            self.table = sinusoidal_table(max(seq_len, 2 * self.table.shape[0]), self.d_model).to(x.device)
        return x * self.scale + self.table[:seq_len].to(x.dtype)
