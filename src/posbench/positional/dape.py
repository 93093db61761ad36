"""DAPE: Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation"
(arXiv:2405.14722).

A static bias B (KERPLE's, the paper's main setting) plus a small MLP f that reads, for each (query, key)
pair, the attention scores and the static bias of every head and returns a correction for each head:

    logits = S + B + f([S, B]),   S = q·kᵀ/√d,   f: 2H -> width -> H with LeakyReLU,

applied to each pair alone (the MLP mixes heads, never positions), so it is exact one block of queries at a
time. posbench follows the authors' code (github.com/chuanyang-Zheng/DAPE: ``ParallelKerpleLog_C`` in
``megatron/model/positional_embeddings.py``, which their ``pos-emb: kerple_c`` configuration runs, and
``ParallelKerpleLog_DAPE`` in DAPE.py, the same computation):

* S is the scaled score before the causal mask; the MLP's input puts the H scores first, then the H biases;
* the residual form S + B + f([S, B]);
* f is nn.Linear(2H, width), LeakyReLU (slope 0.01), nn.Linear(width, H) with PyTorch's initialisation
  (their MLP is a plain nn.Linear, outside GPT-NeoX's own initialisation), one per layer;
* KERPLE log: -r1·log(1 + r2·|i − j|) with r1 ~ U(0, 2), r2 ~ U(0, 1), both clamped at 0.01 in place before each
  use: posbench's own ``kerple_log`` (kerple.py), held whole as ``base``.

One difference: the reference builds a KERPLE in every layer; posbench's KERPLE is one for all layers, as its
``kerple_log`` is, so that DAPE and KERPLE differ by the MLP alone. ``base`` may name any static bias
encoding (``alibi``, ``kerple_power``, ``fire``, ``t5``); the reference has DAPE over ALiBi and FIRE too.

Defaults: width 32, the value of every configuration in the reference (12 heads there, 24 inputs; at
posbench's 8 heads 16 inputs, so 32 hidden units are still more than the inputs, as in the paper). The MLP
adds 3·H·width multiply-adds per (query, key) pair: three times the scores' H·head_dim, at width = head_dim = 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import ENCODINGS, Dimensions, EncodingConfig, LayerTerms, PositionEncoding


def dape_correction(scores: Tensor, static: Tensor, mlp: nn.Module) -> Tensor:
    """f([scores, static]) for each (query, key) pair, across heads.

    scores (B, H, Q, K) = q·kᵀ/√d; static (B|1, H, Q, K) the static bias, finite everywhere (at hidden keys any
    value: their logits stay -inf); mlp: 2H -> H on the last axis -> (B, H, Q, K).
    """
    features = torch.cat([scores, static.expand_as(scores)], dim=1)  # (B, 2H, Q, K): scores first, as the reference
    return mlp(features.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # (B, Q, K, 2H) -> (B, Q, K, H) -> (B, H, Q, K)


def static_bias_encodings() -> list[str]:
    """The encodings DAPE can sit on: those with a static bias (``bias_at``) and no content terms of their own."""
    return [
        name
        for name, (_, module) in ENCODINGS.items()
        if module.bias_at is not PositionEncoding.bias_at and module.layer_terms is PositionEncoding.layer_terms
    ]


@dataclass
class DapeConfig(EncodingConfig):
    name: str = "dape"
    #: The static bias encoding under the MLP, with its default options (the paper's main setting: kerple_log).
    base: str = "kerple_log"
    #: Hidden units of the MLP across heads (the reference's 32).
    mlp_width: int = 32

    def problems(self, dims: Dimensions) -> list[str]:
        found = super().problems(dims)
        if self.mlp_width < 1:
            found.append(f"encoding.mlp_width must be positive, got {self.mlp_width}")
        bases = static_bias_encodings()
        if self.base not in bases:
            found.append(f"encoding.base must be one of {', '.join(bases)} (a static bias), got {self.base!r}")
        else:
            found += ENCODINGS[self.base][0]().problems(dims)
        return found


class DapeTerms(LayerTerms):
    """One layer's DAPE: the MLP across heads and the correction it adds to the logits."""

    def __init__(self, n_heads: int, width: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * n_heads, width), nn.LeakyReLU(), nn.Linear(width, n_heads))

    def reset_parameters(self) -> None:
        # PyTorch's nn.Linear initialisation, as the reference's MLP has, not the model's GPT-2 one
        self.mlp[0].reset_parameters()
        self.mlp[2].reset_parameters()

    def logits(self, scores, bias, q, k, state, q_idx, k_idx) -> Tensor:
        hidden = bias == float("-inf")
        static = bias.masked_fill(hidden, 0.0)  # the static bias, finite where the mask hides the key
        return scores + bias + dape_correction(scores, static, self.mlp)


class DAPE(PositionEncoding):
    config_class = DapeConfig

    def __init__(self, cfg: DapeConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        base_config, base_module = ENCODINGS[cfg.base]
        self.base = base_module(base_config(), dims)  # its parameters are DAPE's: ``encoding.base.*``
        self.max_len = self.base.max_len
        self.mlp_width = cfg.mlp_width
        # Score-sized fp32 tensors one block holds at once: the MLP's hidden layer and its activation, width/H
        # each, and about four more (features, logits); 12.3 measured at 8 heads and width 32 (this gives 12).
        self.logit_memory_factor = 4.0 + 2.0 * cfg.mlp_width / dims.n_heads

    def reset_parameters(self) -> None:
        self.base.reset_parameters()

    def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.base.bias_at(head, q_pos, k_pos)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.base.bias(q_pos, k_pos)

    def layer_terms(self) -> DapeTerms:
        return DapeTerms(self.n_heads, self.mlp_width)
