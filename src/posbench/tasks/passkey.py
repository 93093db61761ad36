"""``task=passkey`` (Mohtashami & Jaggi, 2023): a key of ``key_len`` symbols hidden in filler, asked for at the end.

Source: the mark, then the key. Query (the sequence's last tokens): the mark again, then the key, which is the
answer: the mark says "the key follows", so every one of its tokens is predictable from the source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Task, TaskConfig


@dataclass
class PasskeyConfig(TaskConfig):
    name: str = "passkey"
    #: Symbols in the key (distinct, from ``symbols``).
    key_len: int = 4


class Passkey(Task):
    config_class = PasskeyConfig

    def check(self) -> None:
        if not 1 <= self.cfg.key_len <= self.cfg.symbols:
            raise ValueError(f"task.key_len={self.cfg.key_len} must be in [1, task.symbols={self.cfg.symbols}]")

    def source_len(self) -> int:
        return 1 + self.cfg.key_len

    def answer_in_query(self) -> list[bool]:
        return [False] + [True] * self.cfg.key_len

    def pieces(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        marked = np.concatenate([np.full((n, 1), self.offsets["mark"]), self.distinct(rng, n, self.cfg.key_len)], 1)
        return marked, marked
