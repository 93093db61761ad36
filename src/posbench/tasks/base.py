"""What every task shares: its options, its vocabulary and how a sequence is laid out.

A sequence is filler with two pieces written into it: a *source* (the key, the pairs, the span) and, at the
very end, a *query* that asks for it. ``distance`` is the number of filler tokens between the end of the
source and the start of the query; the filler before the source takes up the rest of the length. The
*answer* is the query's tokens that only reading the source predicts; they are the sequence's last targets,
so one mask over the targets (``Batch.answer``) serves every sequence of a length.

Vocabulary: each task's own and small: a mark, ``filler_symbols`` filler symbols and ``symbols`` symbols
the sources are made of (mqar adds as many values). Filler never holds a symbol, so a symbol's only earlier
occurrence is in the source: retrieval is well defined at every distance.

A sequence of ``length`` inputs is ``length + 1`` tokens, the targets the inputs shifted by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional

import numpy as np
import torch
from omegaconf import MISSING
from torch import Tensor

#: What the loss is taken on: the answer's tokens only, or every token.
LOSSES = ("answer", "all")
#: The target of a token outside the loss (``F.cross_entropy``'s ignore_index).
IGNORE = -100


@dataclass
class TaskConfig:
    name: str = MISSING
    #: Filler tokens are drawn from this many symbols, apart from the sources' symbols.
    filler_symbols: int = 16
    #: Sources (keys, spans) are drawn from this many symbols.
    symbols: int = 32
    #: ``answer``: the training loss on the answer's tokens only; ``all``: on every token.
    loss: str = "answer"
    #: Distances evaluated at each length, those the length holds (``null``: 0, train_len x 1/4, 1/2, 1, 2,
    #: 4, 8, 16 and the longest the length holds, the source at the very start).
    distances: Optional[List[int]] = None
    #: Sequences per (eval_len, distance).
    trials: int = 64


@dataclass
class Batch:
    """``x`` and ``y`` (n, length) inputs and next-token targets; ``answer`` (length,): which targets are answers."""

    x: Tensor
    y: Tensor
    answer: Tensor

    def answer_targets(self) -> Tensor:
        """``y`` with every target but the answer's set to IGNORE (the loss on the answer only)."""
        return self.y.masked_fill(~self.answer, IGNORE)


class Task:
    """A task: ``pieces`` draws the sources and queries, the rest is shared. Subclasses set ``config_class``."""

    config_class: ClassVar[type[TaskConfig]] = TaskConfig

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg
        self.offsets, start = {}, 0
        for section, size in self.sections().items():
            self.offsets[section], start = start, start + size
        self.vocab_size = start

    def sections(self) -> dict[str, int]:
        """The vocabulary's sections and their sizes, in id order."""
        return {"mark": 1, "filler": self.cfg.filler_symbols, "symbol": self.cfg.symbols}

    @property
    def vocab(self) -> list[str]:
        """A name per token id (checkpoints keep it, as they keep a corpus's words)."""
        return [f"<{s}>" if n == 1 else f"{s}{i}" for s, n in self.sections().items() for i in range(n)]

    def pieces(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` sources and their queries, (n, source length) and (n, query length) token ids."""
        raise NotImplementedError

    def source_len(self) -> int:
        raise NotImplementedError

    def answer_in_query(self) -> list[bool]:
        """Which of the query's tokens are answers (as targets: each predicted from the token before it)."""
        raise NotImplementedError

    def hides_answers(self) -> bool:
        """Whether the input shows filler where an answer would be the next input (mqar's
        ``answers_in_input=false``): no later query can read an earlier answer."""
        return False

    def check(self) -> None:
        """Raise ValueError, naming the key, for options the task cannot draw from."""

    def overhead(self) -> int:
        """Tokens a sequence holds besides filler."""
        return self.source_len() + len(self.answer_in_query())

    def max_distance(self, length: int) -> int:
        """The longest distance a sequence of ``length`` inputs holds (negative: it holds none)."""
        return length + 1 - self.overhead()

    def distinct(self, rng: np.random.Generator, n: int, k: int, section: str = "symbol") -> np.ndarray:
        """(n, k) ids of ``section``, distinct within a row: a repeated token would make retrieval ambiguous."""
        size = self.sections()[section]
        return self.offsets[section] + np.argsort(rng.random((n, size)), axis=1)[:, :k]

    def sequences(self, rng: np.random.Generator, length: int, distances: np.ndarray) -> Batch:
        """One sequence of ``length`` inputs per distance in ``distances`` (n,)."""
        n, source_len = len(distances), self.source_len()
        filler = self.offsets["filler"] + rng.integers(0, self.cfg.filler_symbols, (n, length + 1))
        source, query = self.pieces(rng, n)
        filler[:, length + 1 - query.shape[1] :] = query
        starts = length + 1 - query.shape[1] - np.asarray(distances) - source_len  # (n,)
        if (starts < 0).any():
            raise ValueError(f"a distance of {int(np.max(distances))} does not fit in {length} tokens")
        np.put_along_axis(filler, starts[:, None] + np.arange(source_len), source, axis=1)
        tokens = torch.from_numpy(filler)
        answer = torch.zeros(length, dtype=torch.bool)
        in_query = self.answer_in_query()
        answer[length - len(in_query) :] = torch.tensor(in_query)
        x = tokens[:, :-1]
        if self.hides_answers():  # each answer a target only: the input after its query token is filler
            shown = answer.nonzero().flatten() + 1  # (answers,): the inputs that would show them
            shown = shown[shown < length]
            hidden = self.offsets["filler"] + rng.integers(0, self.cfg.filler_symbols, (n, len(shown)))
            x = x.clone()
            x[:, shown] = torch.from_numpy(hidden)
        return Batch(x, tokens[:, 1:], answer)

    def batch(self, rng: np.random.Generator, length: int, n: int) -> Batch:
        """``n`` sequences, each at a distance drawn uniformly from all that ``length`` holds (training)."""
        return self.sequences(rng, length, rng.integers(0, self.max_distance(length) + 1, n))
