"""Position encodings, one small module each, behind the seam in :mod:`.base`.

To add an encoding: write a module here with a config dataclass (a subclass of ``EncodingConfig``
that sets ``name``) and a
:class:`PositionEncoding` subclass built as ``Encoding(cfg, dims)`` whose ``config_class`` names
that dataclass, and add ``conf/encoding/<name>.yaml``. Every module of this package is imported
below, and each such subclass registers itself in ``ENCODINGS``.
"""

from __future__ import annotations

import importlib
import pkgutil

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from ..errors import ProblemsFound
from .alibi import alibi_bias, alibi_slopes
from .base import ENCODINGS, Dimensions, EncodingConfig, LayerTerms, PositionEncoding, sample_positions
from .rope import apply_rope, rope_inv_freq
from .rotary import rotary_angles, rotary_inv_freq, rotate_pairs
from .sinusoidal import sinusoidal_table
from .t5 import t5_bucket

for _module in pkgutil.iter_modules(__path__):  # the encodings nobody imports by name register too
    importlib.import_module(f"{__name__}.{_module.name}")
_by_name = sorted(ENCODINGS.items())  # listed by name, whatever the order of import
ENCODINGS.clear()
ENCODINGS.update(_by_name)


def encoding_config(cfg):
    """The config dataclass of the encoding named by ``cfg.name``, from a dataclass, dict or DictConfig.

    Unknown keys and values of the wrong type raise ProblemsFound (a ValueError) naming the key
    (``encoding.thetaa``).
    """
    name = cfg["name"] if isinstance(cfg, dict) else cfg.name
    if name not in ENCODINGS:
        raise ProblemsFound([f"encoding.name must be one of {', '.join(ENCODINGS)}, got {name!r}"])
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ENCODINGS[name][0]), cfg))
    except ConfigKeyError as e:
        raise ProblemsFound([f"encoding.{e.full_key} is not an option of encoding={name}"]) from None
    except OmegaConfBaseException as e:
        raise ProblemsFound([f"encoding.{e.full_key}: {str(e).splitlines()[0]}"]) from None


def encoding_problems(cfg, dims: Dimensions) -> list[str]:
    """Every problem of the encoding config ``cfg`` (as ``encoding_config`` takes it) for a model of ``dims``,
    found without building the encoding."""
    try:
        config = encoding_config(cfg)
    except ProblemsFound as e:
        return e.problems
    return config.problems(dims)


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
    "EncodingConfig",
    "LayerTerms",
    "PositionEncoding",
    "sample_positions",
    "build_encoding",
    "encoding_config",
    "encoding_problems",
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
