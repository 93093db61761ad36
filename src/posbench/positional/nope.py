"""NoPE: no position information beyond the causal mask (Kazemnejad et al., 2023)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .base import Dimensions, EncodingConfig, PositionEncoding

log = logging.getLogger(__name__)


@dataclass
class NoPEConfig(EncodingConfig):
    name: str = "none"


class NoPE(PositionEncoding):
    config_class = NoPEConfig

    def __init__(self, cfg: NoPEConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        if cfg.randomized_positions is not None:
            # allowed, as a control run (scripts/remedies.sh), but it trains exactly the plain model
            log.warning(
                "encoding=none has no positions: encoding.randomized_positions=%d changes nothing",
                cfg.randomized_positions,
            )
