"""The key/value cache of incremental decoding: each new token attends to the keys and values kept from
the tokens before it instead of recomputing them, so a token costs O(context), not a pass over the context.

``LanguageModel.forward(idx, cache=cache)`` runs the tokens ``idx`` at the positions after those in the
cache and adds their keys and values to it (``Attention.positioned``). Keys are kept as attention uses
them: rotated at their positions, or, for an encoding whose rotation depends on the whole pass
(``PositionEncoding.rotates_per_pass``), as computed, to be rotated again at every step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import PosbenchError


class LayerCache:
    """One layer's keys and values, (B, H, capacity, hd) each, filled up to ``length``, and the per-token
    state (B, H, capacity) of its content terms where it has some (``LayerTerms.prepare``).

    Allocated whole at the first tokens, so adding a token writes that token only.
    """

    def __init__(self, capacity: int):
        self.capacity, self.length = capacity, 0
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.state: Tensor | None = None

    def extend(self, k: Tensor, v: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Add the keys and values (B, H, T, hd) and the state (B, H, T) or ``None`` of T new tokens; returns
        those of every token so far."""
        end = self.length + k.shape[-2]
        if end > self.capacity:
            raise PosbenchError(f"the key/value cache holds {self.capacity} tokens; {end} do not fit")
        if self.k is None:
            self.k, self.v = (self.allocate(t) for t in (k, v))
            self.state = None if state is None else self.allocate(state)
        self.k[:, :, self.length : end], self.v[:, :, self.length : end] = k, v
        if state is not None:
            self.state[:, :, self.length : end] = state
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end], None if state is None else self.state[:, :, :end]

    def allocate(self, t: Tensor) -> Tensor:
        """An empty tensor like ``t`` with ``capacity`` tokens on its third axis."""
        return torch.empty(*t.shape[:2], self.capacity, *t.shape[3:], dtype=t.dtype, device=t.device)


class KVCache:
    """Every layer's ``LayerCache`` for sequences of at most ``capacity`` tokens."""

    def __init__(self, n_layers: int, capacity: int):
        self.layers = [LayerCache(capacity) for _ in range(n_layers)]

    @property
    def length(self) -> int:
        """Tokens seen so far: the next one is at this position."""
        return self.layers[0].length
