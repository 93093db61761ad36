"""RoPE: Su et al., 2021, "RoFormer" (arXiv:2104.09864).

Pairs of head dimensions are rotated by position-dependent angles p * theta^(-2i/d).
Two layouts pair the dimensions differently:

* ``interleaved``: adjacent dimensions (2i, 2i+1), the complex-number formulation;
* ``half``: dimensions (i, i + d/2), ``rotate_half`` as in GPT-NeoX and Llama.

They are the same rotation up to a fixed permutation of head dimensions.

Context extension (``scaling``) changes the frequencies at evaluation time, without
retraining, with the formulas of Hugging Face transformers' ``modeling_rope_utils``:

* ``linear`` (position interpolation, Chen et al., 2023): every frequency divided by s;
* ``ntk`` (static "NTK-aware"): base theta * s^(d/(d-2));
* ``dynamic`` (dynamic NTK): as ``ntk`` with s replaced by s*L/L0 - (s-1) for a sequence
  of L > L0 positions, unchanged up to L0;
* ``yarn`` (Peng et al., 2023, arXiv:2309.00071): high frequencies kept, low ones
  interpolated, a linear ramp between, and attention scaled by 0.1*ln(s) + 1.

L0 is ``original_max_position_embeddings`` (default: the training length).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ..errors import raise_problems
from .base import Dimensions, EncodingConfig, PositionEncoding
from .rotary import per_head, rotary_angles, rotary_inv_freq, rotary_problems, rotate_pairs

SCALING_TYPES = ("linear", "ntk", "dynamic", "yarn")


def _yarn_inv_freq(
    head_dim: int, theta: float, factor: float, original_len: int, beta_fast: float, beta_slow: float
) -> Tensor:
    """YaRN's blend: extrapolate dimensions that turn more than beta_fast times in L0, interpolate below beta_slow."""

    def dim_of(rotations: float) -> float:  # the dimension that turns ``rotations`` times over L0 positions
        return head_dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # as in transformers: avoid a zero-width ramp
    # 0: keep the trained frequency (extrapolate), 1: divide it by the factor (interpolate)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # (hd/2,)
    inv_freq = rotary_inv_freq(head_dim, theta)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def scaling_problems(scaling: Mapping | None) -> list[str]:
    """The rules of a scaling (a dict as ``rope_inv_freq`` takes it)."""
    kind = scaling.get("type") if scaling else None
    if kind is None:
        return []
    if kind not in SCALING_TYPES:
        return [f"encoding.scaling.type must be one of {', '.join(SCALING_TYPES)} or null, got {kind!r}"]
    found = []
    factor = float(scaling.get("factor", 1.0))
    if factor < 1:
        found.append(f"encoding.scaling.factor must be >= 1, got {factor}")
    if kind in ("dynamic", "yarn") and not scaling.get("original_max_position_embeddings"):
        found.append(f"encoding.scaling.type={kind} needs encoding.scaling.original_max_position_embeddings")
    return found


def rope_inv_freq(
    head_dim: int, theta: float = 10000.0, scaling: Mapping | None = None, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """Inverse frequencies (head_dim/2,) fp32 and the attention scale for a RoPE context extension.

    ``scaling``: ``None`` or a dict like ``{"type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 256}`` (YaRN also reads ``beta_fast`` (32),
    ``beta_slow`` (1) and ``attention_factor`` (0.1*ln(factor) + 1)). ``seq_len`` is the
    sequence length, used by ``dynamic`` only. As in transformers, the attention scale
    multiplies cos and sin, so q.k logits are multiplied by its square.
    """
    raise_problems(scaling_problems(scaling))
    inv_freq = rotary_inv_freq(head_dim, theta)
    kind = scaling.get("type") if scaling else None
    if kind is None:
        return inv_freq, 1.0
    factor = float(scaling.get("factor", 1.0))
    original_len = scaling.get("original_max_position_embeddings")
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "ntk":
        return rotary_inv_freq(head_dim, theta * factor ** (head_dim / (head_dim - 2))), 1.0
    if kind == "dynamic":
        length = max(seq_len or original_len, original_len)
        effective = factor * length / original_len - (factor - 1)
        return rotary_inv_freq(head_dim, theta * effective ** (head_dim / (head_dim - 2))), 1.0
    beta_fast, beta_slow = scaling.get("beta_fast") or 32.0, scaling.get("beta_slow") or 1.0
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return _yarn_inv_freq(head_dim, theta, factor, original_len, beta_fast, beta_slow), float(attention)


def apply_rope(x: Tensor, positions: Tensor, theta: float = 10000.0, interleaved: bool = False) -> Tensor:
    """Rotary position embedding of x (..., seq, head_dim) at integer ``positions`` (seq,), or of x (B, H, seq,
    head_dim) at positions (B, seq)."""
    angles = per_head(rotary_angles(positions.to(x.device), x.shape[-1], theta))
    return rotate_pairs(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), interleaved)


@dataclass
class RopeScalingConfig:
    """Context extension applied at evaluation (see the module docstring); ``type: null`` is plain RoPE."""

    type: Optional[str] = None
    factor: float = 1.0
    #: L0, the length the model was trained at; ``null``: the training length.
    original_max_position_embeddings: Optional[int] = None
    #: YaRN: dimensions turning more than beta_fast times in L0 keep their frequency...
    beta_fast: float = 32.0
    #: ...those turning fewer than beta_slow times are interpolated by the factor.
    beta_slow: float = 1.0
    #: YaRN's scale on cos/sin; ``null``: 0.1*ln(factor) + 1.
    attention_factor: Optional[float] = None


def scaling_label(scaling: Mapping | None) -> str:
    """The ``variant`` name of a scaling in result rows, e.g. ``yarn×4``; empty for plain RoPE."""
    if not scaling or not scaling.get("type"):
        return ""
    return f"{scaling['type']}×{float(scaling.get('factor', 1.0)):g}"


@dataclass
class RopeConfig(EncodingConfig):
    name: str = "rope"
    theta: float = 10000.0
    layout: str = "half"  # "half" (rotate_half, NeoX/Llama) or "interleaved" (complex pairs)
    scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)

    def problems(self, dims: Dimensions) -> list[str]:
        found = super().problems(dims) + rotary_problems(dims.head_dim, self.theta)
        if self.layout not in ("half", "interleaved"):
            found.append(f"encoding.layout must be 'half' or 'interleaved', got {self.layout!r}")
        return found + scaling_problems(scaling_of(self, dims.train_len))


def scaling_of(cfg: RopeConfig, train_len: int) -> dict | None:
    """``cfg.scaling`` as ``rope_inv_freq`` takes it, L0 defaulting to ``train_len``; ``None`` for plain RoPE."""
    scaling = asdict(cfg.scaling)
    if scaling["type"] and not scaling["original_max_position_embeddings"]:
        scaling["original_max_position_embeddings"] = train_len
    return scaling if scaling["type"] else None


@dataclass
class RopeVariantOptions:
    """What ``posbench eval rope.*`` may change in a trained RoPE model."""

    scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)


class RoPE(PositionEncoding):
    config_class = RopeConfig
    variant_options = RopeVariantOptions

    def __init__(self, cfg: RopeConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.head_dim, self.theta, self.interleaved = dims.head_dim, cfg.theta, cfg.layout == "interleaved"
        self.scaling = scaling_of(cfg, dims.train_len)

    @classmethod
    def variant_label(cls, cfg: RopeConfig) -> str:
        return scaling_label(asdict(cfg.scaling))

    def tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin (T, hd/2), or (B, 1, T, hd/2) for per-sequence positions (B, T), times the attention scale.

        Dynamic NTK's frequencies depend on the sequence length T, the others' on nothing.
        """
        inv_freq, attention_scale = rope_inv_freq(self.head_dim, self.theta, self.scaling, seq_len=positions.shape[-1])
        angles = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)  # (..., T, hd/2)
        return per_head(angles.cos() * attention_scale), per_head(angles.sin() * attention_scale)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.for_positions(positions, self.tables)  # shared by all layers; never in checkpoints
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q_cos, q_sin = cos[..., -q.shape[-2] :, :], sin[..., -q.shape[-2] :, :]  # the queries: the last positions
        return rotate_pairs(q, q_cos, q_sin, self.interleaved), rotate_pairs(k, cos, sin, self.interleaved)

    @property
    def rotates_per_pass(self) -> bool:
        """Dynamic NTK's frequencies follow the pass's length."""
        return self.scaling is not None and self.scaling["type"] == "dynamic"
