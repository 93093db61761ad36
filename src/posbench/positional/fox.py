"""FoX, the Forgetting Transformer: Lin et al., ICLR 2025, "Forgetting Transformer: Softmax Attention with
a Forget Gate" (arXiv:2503.02130).

Every layer has a forget gate per head, computed from each token: f_t = σ(w_h·x_t + b_h), x_t the layer's
attention input. The logit of query i for key j gains D_ij = Σ_{l=j+1..i} log f_l = c_i − c_j, with
c_t = Σ_{l≤t} log f_l: a data-dependent ALiBi, whose decay each token sets. There is no other position
encoding (the paper's "FoX (LLaMA)", without RoPE).

posbench follows the reference layer (``ForgettingAttentionLayer`` of zhixuan-lin/forgetting-transformer,
and fla's ``ForgettingAttention``) with its defaults: ``fgate_type="full"`` (a Linear d_model → n_heads with
bias per layer), the gate's weight drawn as every other projection (GPT-2's normal(0, 0.02) here, the
reference's ``initializer_range``) and its bias at zero, so f starts near σ(0) = ½. Left out: the "Pro"
block's output gate, output norm, QK-norm and key/value shift, and the data-independent gate types
(``bias_only``, ``fixed``) with their decay-time initialisation; ``gate_bias`` sets the initial bias for
readers who want slower forgetting at the start. As in the reference, the key/value cache keeps each token's
log f beside its key and value. The gate is computed in fp32 under autocast (the reference casts its
logit to fp32 before the log-sigmoid): the cumulative sums add thousands of values.

D_ij is one term added to each score, so FoX also runs on FlexAttention (``ForgetGate.score_mod``, the
cumulative sums captured): ``model.attention=flex``, and ``auto`` to evaluate long sequences, where it was
measured faster than eager (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dimensions, EncodingConfig, LayerTerms, PositionEncoding


@dataclass
class FoXConfig(EncodingConfig):
    name: str = "fox"
    #: Initial bias b of every forget gate (the reference's 0: f ≈ ½ at the start).
    gate_bias: float = 0.0


class ForgetGate(LayerTerms):
    """One layer's forget gates: ``prepare`` gives log f_t (B, H, T), ``logits`` adds c_i − c_j."""

    def __init__(self, d_model: int, n_heads: int, bias: float):
        super().__init__()
        self.proj = nn.Linear(d_model, n_heads)
        self.initial_bias = bias

    def reset_parameters(self) -> None:
        nn.init.constant_(self.proj.bias, self.initial_bias)  # the weight keeps the model's normal(0, 0.02)

    def prepare(self, x: Tensor) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)  # fp32 at least, as the reference's log-sigmoid
        with torch.autocast(x.device.type, enabled=False):
            logit = F.linear(x.to(dtype), self.proj.weight.to(dtype), self.proj.bias.to(dtype))  # (B, T, H)
        return F.logsigmoid(logit).transpose(1, 2)  # (B, H, T): log f_t

    def logits(
        self, scores: Tensor, bias: Tensor, q: Tensor, k: Tensor, state: Tensor, q_idx: Tensor, k_idx: Tensor
    ) -> Tensor:
        c = state.cumsum(-1)  # (B, H, T): c_t = Σ_{l≤t} log f_l over every token so far
        return scores + bias + (c[..., q_idx, None] - c[..., None, k_idx])  # (B, H, Q, K)

    def score_mod(self, state: Tensor) -> Callable:
        c = state.cumsum(-1)  # as in ``logits``, once per pass; fp32 at least (``prepare``)

        def add_decay(score: Tensor, batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + (c[batch, head, q_idx] - c[batch, head, kv_idx])

        return add_decay


class FoX(PositionEncoding):
    config_class = FoXConfig
    reads_positions = False  # its terms count by the content alone
    terms_on_flex = True  # D_ij is one term added to each score: ``ForgetGate.score_mod``

    def __init__(self, cfg: FoXConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        self.d_model, self.gate_bias = dims.d_model, cfg.gate_bias

    def layer_terms(self) -> ForgetGate:
        return ForgetGate(self.d_model, self.n_heads, self.gate_bias)
