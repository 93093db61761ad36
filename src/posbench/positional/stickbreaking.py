"""Stick-breaking attention: Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study" (arXiv:2410.17980).

Softmax is replaced: query i looks back from the nearest key, and each key j takes the share β_ij = σ(z_ij),
z_ij = q_i·k_j/√d, of the stick that the keys between them left over:

    A_ij = β_ij · ∏_{j<l<i} (1 − β_il)        for the keys j < i,

and what no earlier key took, ∏_{l<i} (1 − β_il), goes to the query's own value. The weights of a query
sum to 1; nearness alone orders the keys, so there is no position encoding.

posbench follows the authors' implementation (shawntan/stickbreaking-attention: ``attend_current=False``
and ``o + rem·v`` as in its tests and the model layer that uses it) and no learned offset on z. fla's
``StickBreakingAttention`` layer drops the remainder instead (query 0 then attends to nothing); its
``attend_current=True`` lets the query's own key break the stick first; neither is followed.

Computed in log space, in the logits hook (where the key indices tell each query's own key): log β = log σ(z),
log(1 − β) = log σ(−z), and the products are reverse cumulative sums over the keys. Keys hidden by the
causal mask or an evaluation-time variant (logit −inf) get weight 0 and break nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Dimensions, EncodingConfig, LayerTerms, PositionEncoding


@dataclass
class StickBreakingConfig(EncodingConfig):
    name: str = "stickbreaking"


class StickBreakingTerms(LayerTerms):
    """``logits`` gives the log-weights log A_ij; ``weights`` exponentiates them (no softmax)."""

    def logits(
        self, scores: Tensor, bias: Tensor, q: Tensor, k: Tensor, state: Tensor | None, q_idx: Tensor, k_idx: Tensor
    ) -> Tensor:
        z = scores + bias  # (B, H, Q, K); hidden keys -inf; fp32 at least (the mask is fp32)
        own = q_idx[:, None] == k_idx[None, :]  # (Q, K): each query's own key
        log_rest = F.logsigmoid(-z).masked_fill(own, 0.0)  # log(1 − β_il); 0 where l hides or is the query
        after = log_rest.flip(-1).cumsum(-1).flip(-1)  # Σ_{l ≥ j}
        between = F.pad(after[..., 1:], (0, 1))  # Σ_{l > j}: the keys between j and the query
        return torch.where(own, log_rest.sum(-1, keepdim=True), F.logsigmoid(z) + between)

    def weights(self, logits: Tensor) -> Tensor:
        return logits.exp()


class StickBreaking(PositionEncoding):
    config_class = StickBreakingConfig
    reads_positions = False  # its terms count by the content alone
    #: z, its two log-sigmoids, the reverse cumulative sum and its shift, the log-weights, the weights.
    logit_memory_factor = 8.0

    def __init__(self, cfg: StickBreakingConfig, dims: Dimensions):
        super().__init__(cfg, dims)

    def layer_terms(self) -> StickBreakingTerms:
        return StickBreakingTerms()
