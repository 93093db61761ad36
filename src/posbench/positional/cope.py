"""CoPE: Golovneva et al., 2024, "Contextual Position Encoding: Learning to Count What's Important"
(arXiv:2405.18719).

Positions are counted by gates the queries set, not by tokens. Query i gives every key k a gate
g_ik = σ(q_i·k_k/√d), and key j sits at the contextual position p_ij = Σ_{k=j..i} g_ik (a cumulative sum over
keys, from the query back). The logit of key j gains q_i·e[p_ij]/√d, where e is a learned table of embeddings
at the integer positions 0..npos_max−1, p_ij is capped at npos_max−1, and a fractional position takes the
products q_i·e at its floor and ceiling, mixed linearly (each product computed once per integer, then
interpolated: npos_max products per query, not one per key). CoPE is the only position encoding: nothing is
added to the tokens or rotated, and the static mask carries no bias.

posbench follows the authors' code (github.com/facebookresearch/RAM, ``projects/cope``,
``ContextPosSelfAttn``) with its default options:

* the gates read the attention keys (no separate key projection, ``--cope-sep-key``; not the values,
  ``--cope-val-gates``), through σ(q·k/√d);
* the CoPE term is divided by √d with the scores, logits = (q·k + q·e[p])/√d (``--cope-nodiv`` off; the
  paper's short listing adds q·e[p] undivided, which is the same model with e scaled by √d);
* one table e (npos_max × head_dim) per layer (``--cope-shared`` off), shared by the layer's heads (the
  reference multiplies every head's queries by the same table), initialised to zeros;
* CoPE on every layer (``--cope-layers 1``), with no other position encoding (``--pos-emb cope``).

npos_max: the reference defaults to every position (block size + 1); the DAPE authors' CoPE baseline
(github.com/chuanyang-Zheng/DAPE, ``CoPE(64, head_dim)``) caps at 64 for 512 training tokens. posbench keeps
that proportion, npos_max = train_len / 8 (32 at train_len 256; ``npos_max=null``). A cap well below the
training length means the capped position's embedding is reached, and trained, in every training sequence
(at init every gate is about 1/2, so keys 2·npos_max tokens back already reach it), and a longer evaluation
meets no position whose embedding never learned; with the reference's default, the positions near train_len
are reached only where nearly every gate is open, so their embeddings stay near their initial zeros. The
table is small (32 × head_dim 32 per layer), so head_dim does not press on the choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .base import Dimensions, EncodingConfig, LayerTerms, PositionEncoding

#: npos_max = train_len / this, for ``npos_max=null`` (the DAPE authors' CoPE baseline: 64 at 512 tokens).
TRAIN_LEN_PER_POSITION = 8


def at_least_fp32(x: Tensor) -> Tensor:
    """x in fp32, or in its own dtype if wider: bf16 would round a long sum of gates to whole steps of 2 and more."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def contextual_positions(scores: Tensor, hidden: Tensor, npos_max: int) -> Tensor:
    """p_ij = Σ_{k=j..i} σ(scores_ik) over the keys query i sees, capped at npos_max − 1.

    scores (B, H, Q, K) = q·kᵀ/√d, keys in token order; hidden (B|1, H|1, Q, K) True where the query does
    not see the key (its gate is 0, so it counts nothing). The reverse cumulative sum over keys gives
    each key the gates from it up to the query: keys past the query are hidden, so they add nothing.
    """
    gates = at_least_fp32(scores).sigmoid().masked_fill(hidden, 0.0)  # (B, H, Q, K)
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos_max - 1)  # (B, H, Q, K)


def interpolated_logits(q: Tensor, embeddings: Tensor, positions: Tensor) -> Tensor:
    """q_i·e[p_ij]/√d at fractional positions: the products at floor(p) and ceil(p), mixed by p − floor(p).

    q (B, H, Q, hd), embeddings (npos, hd) shared by the heads, positions (B, H, Q, K) in [0, npos − 1].
    The floor and ceiling carry no gradient; the weight p − floor(p) does, so the gates learn through it.
    """
    at_integers = at_least_fp32(q) @ at_least_fp32(embeddings).T  # (B, H, Q, npos)
    floor = positions.floor()
    below = at_integers.gather(-1, floor.long())  # (B, H, Q, K)
    above = at_integers.gather(-1, positions.ceil().long())
    weight = positions - floor  # (B, H, Q, K)
    return (above * weight + below * (1 - weight)) * q.shape[-1] ** -0.5


@dataclass
class CopeConfig(EncodingConfig):
    name: str = "cope"
    #: Integer positions with an embedding; contextual positions are capped at npos_max − 1
    #: (``null``: train_len / 8, the proportion of the DAPE authors' CoPE baseline, 64 at 512 tokens).
    npos_max: Optional[int] = None

    def problems(self, dims: Dimensions) -> list[str]:
        found = super().problems(dims)
        if self.npos_max is not None and self.npos_max < 2:
            found.append(f"encoding.npos_max must be at least 2 (positions 0 and 1), got {self.npos_max}")
        return found


class CopeTerms(LayerTerms):
    """One layer's CoPE: its table of position embeddings and the term it adds to the logits."""

    def __init__(self, npos_max: int, head_dim: int):
        super().__init__()
        self.npos_max = npos_max
        self.embeddings = nn.Parameter(torch.zeros(npos_max, head_dim))  # (npos, hd): zeros, as the reference

    def logits(self, scores, bias, q, k, state, q_idx, k_idx) -> Tensor:
        start, positions = self.counted(scores, bias)  # (B, H, Q, K − start)
        logits = scores + bias
        logits[..., start:] += interpolated_logits(q, self.embeddings, positions)
        if start > 0:  # the older keys, all at the cap: one term per query
            capped = positions.new_full((*positions.shape[:-1], 1), self.npos_max - 1)
            logits[..., :start] += interpolated_logits(q, self.embeddings, capped)
        return logits

    def counted(self, scores: Tensor, bias: Tensor) -> tuple[int, Tensor]:
        """The first key whose position may fall below the cap for some query, and the positions from it on.

        The queries are the last of the keys. Gates are positive, so a position only grows with distance: once
        the oldest key tried is at the cap for every query, every older key is too. Trying the newest keys
        first, and twice as many until that holds, spares the gates, sums and interpolation of the older keys
        (most of a long sequence's: a trained gate rarely stays shut for long; docs/performance.md).
        """
        n_keys = scores.shape[-1]
        width = scores.shape[-2] + 8 * self.npos_max
        while True:
            start = max(0, n_keys - width)
            hidden = bias[..., start:] == float("-inf")
            positions = contextual_positions(scores[..., start:], hidden, self.npos_max)
            if start == 0 or bool((positions[..., 0] == self.npos_max - 1).all()):
                return start, positions
            width *= 2


class CoPE(PositionEncoding):
    config_class = CopeConfig
    reads_positions = False  # its terms count by the content alone
    #: Score-sized fp32 tensors one block holds at once (gates, positions, their floor and ceiling as int64,
    #: the two gathers, the weight, the logits, ...): a peak of 10 measured at 8 heads over 16,384 keys.
    logit_memory_factor = 10.0

    def __init__(self, cfg: CopeConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.npos_max = cfg.npos_max or max(2, dims.train_len // TRAIN_LEN_PER_POSITION)
        self.head_dim = dims.head_dim

    def layer_terms(self) -> CopeTerms:
        return CopeTerms(self.npos_max, self.head_dim)
