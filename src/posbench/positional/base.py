"""The seam between the model and every position encoding.

An encoding touches attention in at most one of three places, and overrides only that one:

* absolute encodings add to the token embeddings (``embed``);
* rotary encodings transform queries and keys (``rotate``);
* bias encodings add a per-head term to the attention logits (``bias_at``).

The model calls all three unconditionally; the defaults are no-ops, so the model
never branches on an encoding's name.

Every encoding is built as ``Encoding(cfg, dims)``: its config dataclass and the model's
:class:`Dimensions`. Options that may change at evaluation time without retraining (RoPE's
``scaling``) are declared by ``variant_options`` and named in result rows by ``variant_label``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Dimensions:
    """What an encoding may need to know about the model it serves."""

    n_heads: int
    head_dim: int
    d_model: int
    #: The training length (some encodings size tables or thresholds by it).
    train_len: int


#: Every encoding by name: (config dataclass, module class). A subclass that names its ``config_class``
#: registers itself here when its module is imported; ``positional/__init__`` imports every module.
ENCODINGS: dict[str, tuple[type, type[PositionEncoding]]] = {}


class PositionEncoding(nn.Module):
    #: The encoding's config dataclass; the default of its ``name`` field is the encoding's name.
    config_class: ClassVar[type | None] = None
    #: Longest sequence the encoding can serve (``None``: any length).
    max_len: int | None = None
    #: Dataclass of the config fields that may change at evaluation time (``None``: none). Its
    #: fields must also be fields of the encoding's config; ``posbench eval`` offers them under
    #: the encoding's name (``rope.scaling.factor=4`` sets ``encoding.scaling.factor``).
    variant_options: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        config = cls.__dict__.get("config_class")
        if config is not None:
            ENCODINGS[config.name] = (config, cls)

    def __init__(self, dims: Dimensions):
        super().__init__()
        self.n_heads = dims.n_heads

    @classmethod
    def variant_label(cls, cfg) -> str:
        """The ``variant`` column of result rows for config ``cfg``, e.g. ``yarn×4``; empty as trained."""
        return ""

    def reset_parameters(self) -> None:
        """Initialise the parameters that are drawn with the model's own layers.

        The model calls it once, after building every layer and before initialising its own;
        parameters drawn in the constructor need nothing here.
        """

    def embed(self, x: Tensor) -> Tensor:
        """x: (B, T, D) token embeddings of positions 0..T-1 -> same shape."""
        return x

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, hd) at positions 0..T-1 -> transformed q, k."""
        return q, k

    def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Logit bias for query position ``q_pos`` and key position ``k_pos`` in ``head``.

        Elementwise over broadcastable integer tensors, so the same definition serves
        a dense (H, Q, K) bias and FlexAttention's ``score_mod`` (scalars there).
        ``None``: the encoding adds no bias. Values above the causal diagonal may be anything.
        """
        return None

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Dense logit bias (H, Q, K) for query positions (Q,) and key positions (K,).

        Override only when a vectorised form is much cheaper than ``bias_at``.
        """
        heads = torch.arange(self.n_heads, device=q_pos.device)
        return self.bias_at(heads[:, None, None], q_pos[None, :, None], k_pos[None, None, :])

    @property
    def has_bias(self) -> bool:
        return type(self).bias_at is not PositionEncoding.bias_at

    @property
    def is_static(self) -> bool:
        """True when nothing the encoding computes can change during training."""
        return not any(p.requires_grad for p in self.parameters())

    def unsupported_reason(self, seq_len: int) -> str | None:
        """Why the encoding cannot serve ``seq_len`` positions, or ``None`` if it can."""
        if self.max_len is not None and seq_len > self.max_len:
            return f"{type(self).__name__} has {self.max_len} positions; cannot serve {seq_len}"
        return None
