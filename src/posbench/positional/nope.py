"""NoPE: no position information beyond the causal mask (Kazemnejad et al., 2023)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import EncodingConfig, PositionEncoding


@dataclass
class NoPEConfig(EncodingConfig):
    name: str = "none"


class NoPE(PositionEncoding):
    config_class = NoPEConfig
    reads_positions = False
