"""The optimizer and learning-rate schedule ``posbench train`` steps with (``bench`` times the same)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .model import LanguageModel


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: LanguageModel, cfg) -> torch.optim.AdamW:
    """AdamW with ``cfg.lr`` and ``cfg.weight_decay`` (a TrainConfig)."""
    # Decay matrices only; norms, biases and the encoding's parameters (its own and its layers' content terms,
    # LanguageModel.encoding_parameters) are left alone.
    encoding = {id(p) for p in model.encoding_parameters()}
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 and id(p) not in encoding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # CUDA's fused kernel updates every parameter in one launch; the CPU keeps the default (foreach) path.
    fused = all(p.is_cuda for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused or None)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg) -> torch.optim.lr_scheduler.LambdaLR:
    """``lr_factor`` per step over ``cfg.steps`` (a TrainConfig)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    )
