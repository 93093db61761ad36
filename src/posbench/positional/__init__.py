"""Position encodings, one small module each, behind the seam in :mod:`.base`.

To add an encoding: write a module with a config dataclass (``name`` first) and a
:class:`PositionEncoding` subclass built as ``Encoding(cfg, dims)``, list it in ``ENCODINGS``
and add ``conf/encoding/<name>.yaml``.
"""

from __future__ import annotations

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from .alibi import ALiBi, AlibiConfig, alibi_bias, alibi_slopes
from .base import Dimensions, PositionEncoding
from .fire import FIRE, FireConfig
from .kerple import KerpleLog, KerpleLogConfig, KerplePower, KerplePowerConfig
from .learned import Learned, LearnedConfig
from .nope import NoPE, NoPEConfig
from .rope import RoPE, RopeConfig, apply_rope, rope_inv_freq
from .rotary import rotary_angles, rotary_inv_freq, rotate_pairs
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


def encoding_config(cfg):
    """The config dataclass of the encoding named by ``cfg.name``, from a dataclass, dict or DictConfig.

    Unknown keys and values of the wrong type raise ValueError naming the key (``encoding.thetaa``).
    """
    name = cfg["name"] if isinstance(cfg, dict) else cfg.name
    if name not in ENCODINGS:
        raise ValueError(f"encoding.name must be one of {', '.join(ENCODINGS)}, got {name!r}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ENCODINGS[name][0]), cfg))
    except ConfigKeyError as e:
        raise ValueError(f"encoding.{e.full_key} is not an option of encoding={name}") from None
    except OmegaConfBaseException as e:
        raise ValueError(f"encoding.{e.full_key}: {str(e).splitlines()[0]}") from None


def build_encoding(cfg, *, n_heads: int, head_dim: int, d_model: int, train_len: int) -> PositionEncoding:
    """Build the encoding named by ``cfg.name`` from its config (see ``encoding_config``)."""
    config = encoding_config(cfg)
    return ENCODINGS[config.name][1](config, Dimensions(n_heads, head_dim, d_model, train_len))


def variant_namespaces() -> dict[str, type]:
    """Encoding name -> the dataclass of its evaluation-time options, for every encoding that has some."""
    return {name: module.variant_options for name, (_, module) in ENCODINGS.items() if module.variant_options}


__all__ = [
    "ENCODINGS",
    "Dimensions",
    "PositionEncoding",
    "build_encoding",
    "encoding_config",
    "variant_namespaces",
    "alibi_slopes",
    "alibi_bias",
    "apply_rope",
    "rope_inv_freq",
    "rotary_angles",
    "rotary_inv_freq",
    "rotate_pairs",
    "sinusoidal_table",
    "t5_bucket",
]
