"""``task=mqar``: multi-query associative recall (Arora et al., 2023, Zoology).

Source: ``pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys distinct, from ``symbols``; values from a
vocabulary of their own, as in Zoology). Query (the sequence's last tokens): ``queries`` of the keys, in a
random order, each followed by its value, which is the answer. Distinct keys by default; with
``repeat_keys`` each query draws its key from all the pairs, so one may be asked again (and ``queries`` may
exceed ``pairs``): excluding the values already given no longer predicts the next. With
``answers_in_input=false`` (Zoology's protocol) the input shows filler in place of each value, which stays the
target: no query sees another's answer. ``distance`` is the
filler between the last pair and the first query; a pair's own gap to its query adds its place in the two
blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import Task, TaskConfig


@dataclass
class MqarConfig(TaskConfig):
    name: str = "mqar"
    #: Key-value pairs in the source.
    pairs: int = 8
    #: Keys asked for at the end (distinct, of the pairs', unless ``repeat_keys``).
    queries: int = 4
    #: Each query draws its key from all the pairs (a key may be asked again; ``queries`` may exceed ``pairs``).
    repeat_keys: bool = False
    #: False: as in Zoology, the input after each query key is filler, not its value (the value a target only),
    #: so that no query reads an earlier one's answer.
    answers_in_input: bool = True


class Mqar(Task):
    config_class = MqarConfig

    def sections(self) -> dict[str, int]:
        return {**super().sections(), "value": self.cfg.symbols}

    def check(self) -> None:
        c = self.cfg
        if not 1 <= c.pairs <= c.symbols:
            raise ValueError(f"task.pairs={c.pairs} must be in [1, task.symbols={c.symbols}] (keys are distinct)")
        if c.queries < 1 or (c.queries > c.pairs and not c.repeat_keys):
            raise ValueError(
                f"task.queries={c.queries} must be in [1, task.pairs={c.pairs}] (or task.repeat_keys=true)"
            )

    def hides_answers(self) -> bool:
        return not self.cfg.answers_in_input

    def source_len(self) -> int:
        return 2 * self.cfg.pairs

    def answer_in_query(self) -> list[bool]:
        return [False, True] * self.cfg.queries

    def pieces(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        c = self.cfg
        keys = self.distinct(rng, n, c.pairs)  # (n, pairs)
        values = self.offsets["value"] + rng.integers(0, c.symbols, (n, c.pairs))
        if c.repeat_keys:
            asked = rng.integers(0, c.pairs, (n, c.queries))  # which pairs, in asking order
        else:
            asked = np.argsort(rng.random((n, c.pairs)), axis=1)[:, : c.queries]
        source = np.stack([keys, values], 2).reshape(n, -1)  # k1 v1 k2 v2 ...
        query = np.stack([np.take_along_axis(a, asked, 1) for a in (keys, values)], 2).reshape(n, -1)
        return source, query
