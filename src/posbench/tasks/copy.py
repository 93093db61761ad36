"""``task=copy``: a span of ``span`` symbols, filler, the span again: the copy probe's geometry (probes/copy.py)
with synthetic filler.

Source: the span. Query (the sequence's last tokens): the span again, unannounced: its first token is not
predictable, the other ``span - 1`` are the answer, as the copy probe scores them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Task, TaskConfig


@dataclass
class CopyConfig(TaskConfig):
    name: str = "copy"
    #: Symbols in the span (distinct, from ``symbols``); its last span - 1 are scored.
    span: int = 8


class Copy(Task):
    config_class = CopyConfig

    def check(self) -> None:
        if not 2 <= self.cfg.span <= self.cfg.symbols:
            raise ValueError(f"task.span={self.cfg.span} must be in [2, task.symbols={self.cfg.symbols}]")

    def source_len(self) -> int:
        return self.cfg.span

    def answer_in_query(self) -> list[bool]:
        return [False] + [True] * (self.cfg.span - 1)

    def pieces(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        span = self.distinct(rng, n, self.cfg.span)
        return span, span
