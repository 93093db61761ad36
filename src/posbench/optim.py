"""The optimizer and learning-rate schedule ``posbench train`` steps with (``bench`` times the same)."""

from __future__ import annotations

import math

import torch
from torch import nn


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, cfg) -> torch.optim.AdamW:
    """AdamW with ``cfg.lr`` and ``cfg.weight_decay`` (a TrainConfig)."""
    # Decay matrices only; norms, biases and the encoding's own few parameters are left alone.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("encoding.") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # CUDA's fused kernel updates every parameter in one launch; the CPU keeps the default (foreach) path.
    fused = all(p.is_cuda for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused or None)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg) -> torch.optim.lr_scheduler.LambdaLR:
    """``lr_factor`` per step over ``cfg.steps`` (a TrainConfig)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
    )
