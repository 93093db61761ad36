"""Sinusoidal absolute positions: Vaswani et al., 2017, "Attention Is All You Need"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import Dimensions, EncodingConfig, PositionEncoding


def sinusoidal_embedding(positions: Tensor, d_model: int) -> Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)) at integer ``positions``
    of any shape (...) -> (..., d_model) fp32."""
    position = positions.to(torch.float32)[..., None]
    div = 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device) / d_model)
    out = torch.zeros(*positions.shape, d_model, device=positions.device)
    out[..., 0::2] = torch.sin(position / div)
    out[..., 1::2] = torch.cos(position / div)[..., : d_model // 2]
    return out


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """The embeddings of positions 0..n-1, (n, d_model)."""
    return sinusoidal_embedding(torch.arange(n_positions), d_model)


@dataclass
class SinusoidalConfig(EncodingConfig):
    name: str = "sinusoidal"
    #: Multiply token embeddings by sqrt(d_model) before adding the table, as in the
    #: Transformer paper and fairseq; otherwise the unit-amplitude table drowns them.
    scale_embeddings: bool = True


class Sinusoidal(PositionEncoding):
    config_class = SinusoidalConfig

    def __init__(self, cfg: SinusoidalConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.d_model = dims.d_model
        self.scale = math.sqrt(dims.d_model) if cfg.scale_embeddings else 1.0

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        table = self.for_positions(positions, lambda p: sinusoidal_embedding(p, self.d_model))  # (T, D) or (B, T, D)
        return x * self.scale + table.to(x.dtype)
