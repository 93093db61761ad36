"""NoPE: no position information beyond the causal mask (Kazemnejad et al., 2023)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Dimensions, EncodingConfig, PositionEncoding


@dataclass
class NoPEConfig(EncodingConfig):
    name: str = "none"


class NoPE(PositionEncoding):
    config_class = NoPEConfig

    def __init__(self, cfg: NoPEConfig, dims: Dimensions):
        super().__init__(cfg, dims)
