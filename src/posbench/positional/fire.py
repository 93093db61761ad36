"""FIRE: Li et al., 2023, "Functional Interpolation for Relative Positions Improves Long
Context Transformers" (arXiv:2310.04418).

The bias of query i and key j is f_θ(ψ(i − j) / ψ(max(L, i))) with ψ(x) = log(c·x + 1) and
f_θ an MLP 1 → width → heads (ReLU). Dividing by ψ(i) maps every distance into [0, 1] whatever
the length ("progressive interpolation"); the threshold L keeps the normaliser from being tiny
for early queries. c, L and f_θ are learned.

Initialised as in the paper's listing: c = 0.1, the MLP 1 → 32 → heads with PyTorch's nn.Linear
initialisation, and L = |s|·L₀ with the multiplier s learned from 1 and L₀ = 512 for the paper's
training length of 2,048 tokens. posbench keeps that proportion, L₀ = train_len / 4
(``init_threshold=null``), so that training queries past L already take the progressive
normaliser ψ(i) (at L₀ = train_len none would). ψ uses |c·x| and L the magnitude |s·L₀|, as there.
L₀ is saved with the weights; a checkpoint from before had L₀ = its training length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Dimensions, EncodingConfig, PositionEncoding

#: Keeps the normaliser ψ(max(L, i)) away from zero (the paper's eps).
EPS = 1e-6
#: (query, key) pairs per block in ``bias``: the hidden layer holds width floats per pair.
PAIRS_PER_BLOCK = 2**20
#: The paper's initial threshold over its training length: L₀ = 512 for 2,048 tokens.
PAPER_THRESHOLD_RATIO = 512 / 2048


def linear_init(*shape: int, fan_in: int) -> nn.Parameter:
    """nn.Linear's default initialisation, U(±1/√fan_in), for weights and biases alike.

    Plain parameters rather than nn.Linear: ``bias_at`` reads single weights (it must stay elementwise),
    and checkpoints name them ``w1``, ``b1``, ``w2``, ``b2``.
    """
    bound = 1 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))


def fill_legacy_threshold(module: FIRE, state_dict: dict, prefix: str, *args) -> None:
    """Load-time: a checkpoint saved before L₀ was stored started from the training length (or the
    configured ``init_threshold``), not from the paper's proportion."""
    state_dict.setdefault(prefix + "init_threshold", torch.tensor(module.legacy_threshold))


@dataclass
class FireConfig(EncodingConfig):
    name: str = "fire"
    #: Hidden units of the MLP f_θ.
    mlp_width: int = 32
    #: Initial c in ψ(x) = log(c·x + 1).
    init_c: float = 0.1
    #: Initial threshold L₀ (``null``: train_len / 4, the paper's 512 at its training length 2,048): training
    #: queries past it take the progressive normaliser ψ(i) that every longer evaluation relies on.
    init_threshold: Optional[float] = None

    def problems(self, dims: Dimensions) -> list[str]:
        # init_threshold=null is train_len / 4: positive whenever train_len is (its own rule)
        given = {"mlp_width": self.mlp_width, "init_c": self.init_c, "init_threshold": self.init_threshold}
        bad = [key for key, value in given.items() if value is not None and not value > 0]
        return super().problems(dims) + [f"encoding.{key} must be positive, got {given[key]}" for key in bad]


class FIRE(PositionEncoding):
    config_class = FireConfig

    def __init__(self, cfg: FireConfig, dims: Dimensions):
        super().__init__(cfg, dims)
        init_threshold = dims.train_len * PAPER_THRESHOLD_RATIO if cfg.init_threshold is None else cfg.init_threshold
        self.c = nn.Parameter(torch.tensor(float(cfg.init_c)))
        self.register_buffer("init_threshold", torch.tensor(float(init_threshold)))  # L₀, saved with the weights
        self.legacy_threshold = float(dims.train_len if cfg.init_threshold is None else cfg.init_threshold)
        self.register_load_state_dict_pre_hook(fill_legacy_threshold)
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        self.w1 = linear_init(cfg.mlp_width, fan_in=1)  # (W,): the input is one scalar
        self.b1 = linear_init(cfg.mlp_width, fan_in=1)  # (W,)
        self.w2 = linear_init(dims.n_heads, cfg.mlp_width, fan_in=cfg.mlp_width)  # (H, W)
        self.b2 = linear_init(dims.n_heads, fan_in=cfg.mlp_width)  # (H,)

    def normalized_distance(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """ψ(i − j) / ψ(max(L, i)) over broadcastable positions."""
        threshold = (self.threshold_scale * self.init_threshold).abs()
        distance = torch.log1p((self.c * (q_pos - k_pos)).abs())
        normaliser = torch.log1p((self.c * torch.maximum(q_pos.float(), threshold)).abs()) + EPS
        return distance / normaliser

    def bias_at(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # The sum over hidden units written out term by term: inside FlexAttention's score_mod
        # everything must be pointwise (a reduction over a hidden axis does not compile).
        x = self.normalized_distance(q_pos, k_pos)
        out = self.b2[head]
        for u in range(self.w1.shape[0]):
            out = out + F.relu(x * self.w1[u] + self.b1[u]) * self.w2[head, u]
        return out

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # The MLP once per (query, key) for all heads at once, a block of queries at a time.
        rows = max(1, PAIRS_PER_BLOCK // len(k_pos))
        blocks = []
        for q in q_pos.split(rows):
            x = self.normalized_distance(q[:, None, None], k_pos[None, :, None])  # (q, K, 1)
            blocks.append(F.relu(x * self.w1 + self.b1) @ self.w2.T + self.b2)  # (q, K, W) -> (q, K, H)
        return torch.cat(blocks).permute(2, 0, 1)  # (H, Q, K)
