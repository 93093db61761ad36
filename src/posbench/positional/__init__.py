"""Position encodings, one small module each, behind the seam in :mod:`.base`.

To add an encoding: write a module with a config dataclass (``name`` first) and a
:class:`PositionEncoding` subclass, list it in ``ENCODINGS`` and add
``conf/encoding/<name>.yaml``.
"""

from __future__ import annotations

from .alibi import ALiBi, AlibiConfig, alibi_bias, alibi_slopes
from .base import PositionEncoding
from .fire import FIRE, FireConfig
from .kerple import KerpleLog, KerpleLogConfig, KerplePower, KerplePowerConfig
from .learned import Learned, LearnedConfig
from .nope import NoPE, NoPEConfig
from .rope import RoPE, RopeConfig, apply_rope, rope_inv_freq
from .sinusoidal import Sinusoidal, SinusoidalConfig, sinusoidal_table
from .t5 import T5Bias, T5Config, t5_bucket
from .xpos import XPos, XposConfig

#: name -> (config dataclass, module class)
ENCODINGS: dict[str, tuple[type, type[PositionEncoding]]] = {
    "alibi": (AlibiConfig, ALiBi),
    "rope": (RopeConfig, RoPE),
    "sinusoidal": (SinusoidalConfig, Sinusoidal),
    "learned": (LearnedConfig, Learned),
    "none": (NoPEConfig, NoPE),
    "t5": (T5Config, T5Bias),
    "kerple_log": (KerpleLogConfig, KerpleLog),
    "kerple_power": (KerplePowerConfig, KerplePower),
    "fire": (FireConfig, FIRE),
    "xpos": (XposConfig, XPos),
}


def build_encoding(cfg, *, n_heads: int, head_dim: int, d_model: int, train_len: int) -> PositionEncoding:
    """Build the encoding named by ``cfg.name`` from its (OmegaConf or dataclass) config."""
    config_cls, module_cls = ENCODINGS[cfg.name]
    if not isinstance(cfg, config_cls):
        cfg = config_cls(**dict(cfg))
    return module_cls(cfg, n_heads=n_heads, head_dim=head_dim, d_model=d_model, train_len=train_len)


__all__ = [
    "ENCODINGS",
    "PositionEncoding",
    "build_encoding",
    "alibi_slopes",
    "alibi_bias",
    "apply_rope",
    "rope_inv_freq",
    "sinusoidal_table",
    "t5_bucket",
]
