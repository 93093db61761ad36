"""The seam between the model and every position encoding.

An encoding touches attention in at most one of four places, and overrides only that one:

* absolute encodings add to the token embeddings (``embed``);
* rotary encodings transform queries and keys (``rotate``);
* bias encodings add a per-head term to the attention logits (``bias_at``);
* content encodings, whose terms depend on the tokens (a forget gate, stick-breaking weights), give each
  layer a :class:`LayerTerms` module (``layer_terms``): a per-token quantity from the layer's input
  (``prepare``), a hook on the logits (``logits``) and the rule that turns logits into weights (``weights``).

The model calls all of them unconditionally; the defaults are no-ops, so the model
never branches on an encoding's name.

Each call takes the tokens' positions explicitly: ``positions`` gives them, (T,) or one row per
sequence (B, T). They are 0..T-1, except in training with ``randomized_positions=M`` (every
encoding's option, in :class:`EncodingConfig`): then each sequence gets a sorted random sample of T
distinct positions below M (Ruoss et al., 2023, arXiv:2305.16843).

Every encoding is built as ``Encoding(cfg, dims)``: its config dataclass and the model's
:class:`Dimensions`. The config's ``problems(dims)`` holds its rules; the constructor raises them.
Options that may change at evaluation time without retraining (RoPE's ``scaling``) are declared
by ``variant_options`` and named in result rows by ``variant_label``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import torch
from omegaconf import MISSING
from torch import Tensor, nn

from ..errors import raise_problems

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dimensions:
    """What an encoding may need to know about the model it serves."""

    n_heads: int
    head_dim: int
    d_model: int
    #: The training length (some encodings size tables or thresholds by it).
    train_len: int


@dataclass
class EncodingConfig:
    """What every encoding's config holds; each encoding's dataclass subclasses it and sets ``name``."""

    name: str = MISSING
    #: Train at a sorted random sample of T distinct positions below M per sequence (``null``: 0..T-1);
    #: evaluation stays at 0..L-1. M must be at least the training length.
    randomized_positions: Optional[int] = None

    def problems(self, dims: Dimensions) -> list[str]:
        """The rules of this config that its types cannot express, for a model of ``dims``, each naming its key
        (``encoding.theta``). An encoding with rules of its own extends this list; nothing else checks them:
        the constructor raises them all at once, and ``posbench train`` reports them beside the config's other
        problems without building anything."""
        limit = self.randomized_positions
        if limit is not None and limit < dims.train_len:
            return [
                f"encoding.randomized_positions must be null or at least train_len={dims.train_len} "
                f"(each sequence takes train_len distinct positions below it), got {limit}"
            ]
        return []


def sample_positions(
    batch: int, seq_len: int, limit: int, device=None, generator: torch.Generator | None = None
) -> Tensor:
    """(batch, seq_len) positions: each row a sorted random sample of seq_len distinct integers below ``limit``.

    The seq_len largest of ``limit`` uniform keys pick a uniformly random subset. Without ``generator``
    the device's global generator draws, which the run seeds and saves with its resume state.
    """
    keys = torch.rand(batch, limit, device=device, generator=generator)  # (B, M)
    return keys.topk(seq_len, dim=-1).indices.sort(dim=-1).values  # (B, T)


#: Every encoding by name: (config dataclass, module class). A subclass that names its ``config_class``
#: registers itself here when its module is imported; ``positional/__init__`` imports every module.
ENCODINGS: dict[str, tuple[type, type[PositionEncoding]]] = {}


class LayerTerms(nn.Module):
    """One layer's content terms, owned by that layer's attention (its parameters are the layer's).

    Each method has a default that leaves attention as it is; an encoding overrides what it needs. The
    attention computes them eagerly, one block of queries at a time (``backends.content_attention``).
    """

    def reset_parameters(self) -> None:
        """Initialise the terms' parameters; the model calls it after its GPT-2 initialisation of every
        ``nn.Linear`` and ``nn.Embedding`` inside (which is what the terms get if this does nothing)."""

    def prepare(self, x: Tensor) -> Tensor | None:
        """A per-token quantity (B, H, T) from the layer's attention input x (B, T, D), or ``None``.

        It must depend on each token alone (no sums over tokens): it is computed once per pass, kept
        beside the keys in a key/value cache, and handed whole to ``logits`` as ``state``."""
        return None

    def logits(
        self, scores: Tensor, bias: Tensor, q: Tensor, k: Tensor, state: Tensor | None, q_idx: Tensor, k_idx: Tensor
    ) -> Tensor:
        """The logits (B, H, Q, K) of one block of queries.

        scores (B, H, Q, K): q·kᵀ/√d; q (B, H, Q, hd) and k (B, H, K, hd) as attention uses them (rotated,
        scaled by the variant); bias (B|1, H|1, Q, K): the encoding's static bias with -inf at hidden keys
        (causality, the variant's window or sinks); state (B, H, T): ``prepare``'s, for every token so far;
        q_idx (Q,) and k_idx (K,): the token indices of the queries and keys, to index ``state``.
        Keys that ``bias`` hides must stay -inf."""
        return scores + bias

    def weights(self, logits: Tensor) -> Tensor:
        """Attention weights (B, H, Q, K) over the keys; hidden keys have logit -inf and must get 0."""
        return logits.softmax(dim=-1)

    def score_mod(self, state: Tensor | None) -> Callable | None:
        """What ``logits`` adds to the scores, as a FlexAttention ``score_mod(score, batch, head, q_idx, kv_idx)``
        reading ``state`` (B, H, T'), ``prepare``'s zero-padded to flex's whole blocks; ``None`` (the default):
        these terms run on eager alone. An encoding whose terms give one says so without building them
        (``PositionEncoding.terms_on_flex``): only a softmax of one term per score fits flex."""
        return None


class PositionEncoding(nn.Module):
    #: The encoding's config dataclass, a subclass of EncodingConfig; the default of its ``name`` field
    #: is the encoding's name.
    config_class: ClassVar[type | None] = None
    #: Longest sequence the encoding can serve (``None``: any length).
    max_len: int | None = None
    #: Dataclass of the config fields that may change at evaluation time (``None``: none). Its
    #: fields must also be fields of the encoding's config; ``posbench eval`` offers them under
    #: the encoding's name (``rope.scaling.factor=4`` sets ``encoding.scaling.factor``).
    variant_options: ClassVar[type | None] = None
    #: False for an encoding that never reads the positions it is given (NoPE, and those whose terms count
    #: by the content alone): ``randomized_positions`` is accepted there, as a control run, with a warning.
    reads_positions: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        config = cls.__dict__.get("config_class")
        if config is not None:
            if not issubclass(config, EncodingConfig):  # every encoding offers randomized_positions
                raise TypeError(f"{cls.__name__}.config_class {config.__name__} must subclass EncodingConfig")
            ENCODINGS[config.name] = (config, cls)

    def __init__(self, cfg: EncodingConfig, dims: Dimensions):
        super().__init__()
        raise_problems(cfg.problems(dims))
        if cfg.randomized_positions is not None and not self.reads_positions:
            log.warning(
                "encoding=%s has no positions: encoding.randomized_positions=%d changes nothing",
                cfg.name,
                cfg.randomized_positions,
            )
        self.n_heads = dims.n_heads
        self.randomized_positions = cfg.randomized_positions
        self._counting: tuple[tuple, Tensor] | None = None  # ((length, device), 0..length-1)
        self._derived: tuple[Tensor, object] | None = None  # (positions, what for_positions built from them)

    @classmethod
    def variant_label(cls, cfg) -> str:
        """The ``variant`` column of result rows for config ``cfg``, e.g. ``yarn×4``; empty as trained."""
        return ""

    def reset_parameters(self) -> None:
        """Initialise the parameters that are drawn with the model's own layers.

        The model calls it once, after building every layer and before initialising its own;
        parameters drawn in the constructor need nothing here.
        """

    def positions(self, batch: int, seq_len: int, device=None) -> Tensor:
        """The positions of a pass over ``batch`` sequences of ``seq_len`` tokens: in training with
        ``randomized_positions`` a fresh sample (batch, seq_len) (``sample_positions``), else ``counting``."""
        if self.training and self.randomized_positions is not None:
            return sample_positions(batch, seq_len, self.randomized_positions, device)
        return self.counting(seq_len, device)

    def counting(self, seq_len: int, device=None) -> Tensor:
        """0..seq_len-1 (seq_len,), the same tensor on every call for one length and device, so that what
        is derived from it (tables here, masks in attention) is built once, not once per pass."""
        key = (seq_len, torch.device(device or "cpu"))
        if self._counting is None or self._counting[0] != key:
            self._counting = (key, torch.arange(seq_len, device=device))
        return self._counting[1]

    def for_positions(self, positions: Tensor, build: Callable[[Tensor], object]):
        """``build(positions)``, built again only when another positions tensor comes: every layer of a
        pass gets the same one, and every pass at 0..T-1 the same ``counting`` tensor."""
        if self._derived is None or self._derived[0] is not positions:
            self._derived = (positions, build(positions))
        return self._derived[1]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """x: (B, T, D) token embeddings at ``positions`` (T,) or (B, T) -> same shape."""
        return x

    #: True when a token's rotation depends on the other positions of its pass (its length, its middle), not on
    #: its own position alone: keys rotated in one pass would not fit the queries of the next, so a key cache
    #: keeps them unrotated and rotates them all again at every step (``Attention.positioned``).
    rotates_per_pass: bool = False

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, hd), k (B, H, T, hd) at ``positions`` (T,) or (B, T) -> transformed q, k.

        ``positions`` are the keys'; the queries are the last Tq of them (Tq = T but when a key cache
        rotates every key again for one new query, ``rotates_per_pass``)."""
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

    def layer_terms(self) -> LayerTerms | None:
        """A new :class:`LayerTerms` for one layer (the model calls it once per layer), or ``None``: the
        layers attend by ``rotate`` and ``bias_at`` alone, on any backend."""
        return None

    #: With layer terms: True when they give a ``score_mod`` (``LayerTerms.score_mod``), so that flex may run
    #: them; attention decides by this before it sees a layer's terms.
    terms_on_flex: ClassVar[bool] = False

    #: With layer terms: the fp32 tensors of the scores' size (B, H, Q, K) they hold at once (scores, logits,
    #: log-sigmoids, cumulative sums, weights), by which their query blocks are made smaller than others'.
    logit_memory_factor: ClassVar[float] = 4.0

    @property
    def has_layer_terms(self) -> bool:
        return type(self).layer_terms is not PositionEncoding.layer_terms

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
