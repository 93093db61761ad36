"""Evaluation-time variants of attention, as one value: what changes how a trained model attends, not its
weights. Parsed from the config and checked once (``AttentionVariant.of``, ``problems``), labelled once
(``label``, the evaluation part of a row's ``variant`` column), and passed whole to the attention
(``Attention.evaluated_as``), evaluation, the probes, generation and the task track.

* ``window`` W (``eval.window``): every query attends to its last W keys (the window counterfactual);
* ``blockwise`` W (``eval.blockwise``): blockwise causal attention (Sun et al., 2022, arXiv:2212.10554,
  used there with xPos at inference): positions are cut into blocks of W and every query attends to the
  keys of its own block and of the previous one;
* ``sink`` S (``eval.sink``), with a window or blocks: the sequence's first S keys stay visible to every
  query beside them (the attention sinks of Xiao et al., 2023, arXiv:2309.17453, which a window evicts);
* ``temperature`` tau (``eval.attn_temperature``): q·kᵀ/√d multiplied by tau (Wang et al., 2024,
  arXiv:2404.12224); the encoding's bias is not scaled;
* ``logn`` (``model.logn_scaling``): queries at positions n >= train_len scaled by log(n + 1) / log(train_len)
  (Chiang & Cholak, 2022, arXiv:2202.12172), 1 before, so a model is unchanged on the lengths it trained on.

Adding a variant: one field here (its config key in ``of``, its rule in ``problems``, its part of
``label``), its mask rule (``hides``, with ``cuts_at``) or its score rule (``Attention.scaled``), and its
test; tests/test_adding_a_variant.py shows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionVariant:
    window: int | None = None
    blockwise: int | None = None
    sink: int = 0
    temperature: float | None = None
    logn: bool = False

    @classmethod
    def of(cls, eval_cfg=None, model_cfg=None) -> AttentionVariant:
        """The variant that ``eval.*`` and ``model.logn_scaling`` ask for (either may be None: not set)."""
        logn = bool(model_cfg is not None and model_cfg.get("logn_scaling", False))
        if eval_cfg is None:
            return cls(logn=logn)
        return cls(eval_cfg.window, eval_cfg.blockwise, eval_cfg.sink or 0, eval_cfg.attn_temperature, logn)

    def problems(self) -> list[str]:
        """Each rule this variant breaks, as one line naming its key."""
        found = [
            f"eval.{key} must be a positive number of keys or null, got {keys}"
            for key, keys in (("window", self.window), ("blockwise", self.blockwise))
            if keys is not None and keys < 1
        ]
        if self.sink < 0 or (self.sink and self.window is None and self.blockwise is None):
            found.append(
                "eval.sink keeps the first keys visible beside eval.window or eval.blockwise: it needs one of "
                f"them and must be >= 0, got eval.sink={self.sink}"
            )
        if self.temperature is not None and not 0 < self.temperature < math.inf:
            found.append(f"eval.attn_temperature must be a positive number or null, got {self.temperature}")
        return found

    def label(self) -> str:
        """``logn+window256+sink4+temp1.2``: the parts of a row's ``variant`` that say how it was evaluated."""
        parts = ["logn" if self.logn else ""]
        keys = {"window": self.window, "blockwise": self.blockwise, "sink": self.sink or None}
        parts += [f"{name}{value}" for name, value in keys.items() if value is not None]
        parts.append("" if self.temperature is None else f"temp{self.temperature:g}")
        return "+".join(part for part in parts if part)

    @property
    def cuts_keys(self) -> bool:
        """Whether the variant hides keys from some queries (a window or blocks)."""
        return self.window is not None or self.blockwise is not None

    def oldest_key(self, q_pos):
        """The first key index that query index ``q_pos`` (an int or an integer tensor) attends to, sinks
        aside; 0 or less: every key before it. Never decreases with q.

        ``window`` W: its last W keys, itself included. ``blockwise`` W: the keys of its own block
        [W·b, W·(b+1)) and of the previous block, b = q // W. Both: the keys both allow.
        """
        by_window = q_pos * 0 if self.window is None else q_pos - self.window + 1
        by_block = q_pos * 0 if self.blockwise is None else (q_pos // self.blockwise - 1) * self.blockwise
        return torch.maximum(by_window, by_block) if isinstance(q_pos, torch.Tensor) else max(by_window, by_block)

    def hides(self, q_idx: torch.Tensor, k_idx: torch.Tensor) -> torch.Tensor:
        """Whether query ``q_idx`` cannot see key ``k_idx`` (broadcast tensors; k <= q) in this variant: the mask
        rule every backend takes (masks.py), and what a new variant that cuts keys overrides."""
        if not self.cuts_keys:
            return torch.zeros_like(q_idx < k_idx)
        return (k_idx < self.oldest_key(q_idx)) & (k_idx >= self.sink)

    def cuts_at(self, seq_len: int) -> bool:
        """Whether the variant hides any key at this length: a limit that cuts none (the last query sees key
        0) is plain causal attention."""
        return self.cuts_keys and self.oldest_key(seq_len - 1) > 0


#: Attention as trained.
AS_TRAINED = AttentionVariant()


def logn_factors(seq_len: int, train_len: int, device=None) -> torch.Tensor:
    """(seq_len,) query scales of log-n attention scaling: log(n + 1) / log(train_len) at positions
    n >= train_len, 1 before, so a model is unchanged on the lengths it was trained on.

    Chiang & Cholak, 2022, "Overcoming a Theoretical Limitation of Self-Attention" (arXiv:2202.12172),
    scale attention logits by log n so that attention does not flatten as n grows; this variant
    normalises by log(train_len) and applies only past the training length.
    """
    n = torch.arange(seq_len, device=device, dtype=torch.float32)
    return (torch.log(n + 1) / math.log(train_len)).clamp(min=1.0)
