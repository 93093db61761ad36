"""The seam between the model and every position encoding.

An encoding touches attention in at most one of three places, and overrides only that one:

* absolute encodings add to the token embeddings (``embed``);
* rotary encodings transform queries and keys (``rotate``);
* bias encodings add a per-head term to the attention logits (``bias``).

The model calls all three unconditionally; the defaults are no-ops, so the model
never branches on an encoding's name.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionEncoding(nn.Module):
    #: Longest sequence the encoding can serve (``None``: any length).
    max_len: int | None = None

    def embed(self, x: Tensor) -> Tensor:
        """x: (B, T, D) token embeddings of positions 0..T-1 -> same shape."""
        return x

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, hd) at positions 0..T-1 -> transformed q, k."""
        return q, k

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Logit bias (H, Q, K) for query positions q_pos (Q,) and key positions k_pos (K,).

        ``None`` means the encoding adds no bias. Entries above the causal diagonal
        may hold anything: the model masks them.
        """
        return None

    @property
    def has_bias(self) -> bool:
        return type(self).bias is not PositionEncoding.bias

    @property
    def is_static(self) -> bool:
        """True when nothing the encoding computes can change during training."""
        return not any(p.requires_grad for p in self.parameters())

    def unsupported_reason(self, seq_len: int) -> str | None:
        """Why the encoding cannot serve ``seq_len`` positions, or ``None`` if it can."""
        if self.max_len is not None and seq_len > self.max_len:
            return f"{type(self).__name__} has {self.max_len} positions; cannot serve {seq_len}"
        return None


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(Q, K) matrix of i - j (query minus key position), >= 0 on and below the diagonal."""
    return q_pos[:, None] - k_pos[None, :]
