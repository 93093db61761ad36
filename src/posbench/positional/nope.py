"""NoPE: no position information beyond the causal mask (Kazemnejad et al., 2023)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import PositionEncoding


@dataclass
class NoPEConfig:
    name: str = "none"


class NoPE(PositionEncoding):
    def __init__(self, cfg: NoPEConfig, n_heads: int, **_):
        super().__init__(n_heads)
