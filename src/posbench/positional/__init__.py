"""Position encodings, one small module each, behind the seam in :mod:`.base`.

To add an encoding: write a module with a config dataclass (``name`` first) and a
:class:`PositionEncoding` subclass, list it in ``ENCODINGS`` and add
``conf/encoding/<name>.yaml``.
"""

from __future__ import annotations

from .alibi import ALiBi, AlibiConfig, alibi_bias, alibi_slopes
from .base import PositionEncoding
from .learned import Learned, LearnedConfig
from .nope import NoPE, NoPEConfig
from .rope import RoPE, RopeConfig, apply_rope
from .sinusoidal import Sinusoidal, SinusoidalConfig, sinusoidal_table

#: name -> (config dataclass, module class)
ENCODINGS: dict[str, tuple[type, type[PositionEncoding]]] = {
    "alibi": (AlibiConfig, ALiBi),
    "rope": (RopeConfig, RoPE),
    "sinusoidal": (SinusoidalConfig, Sinusoidal),
    "learned": (LearnedConfig, Learned),
    "none": (NoPEConfig, NoPE),
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
    "sinusoidal_table",
]
