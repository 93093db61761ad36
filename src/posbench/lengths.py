"""The lengths of a run: what it trains, validates and evaluates at, their rules, and each step's length.

``train_len`` is the length a model is built and validated at; ``train.lengths`` (with ``train.length_order``)
mixes shorter ones into training at equal tokens per step; ``train.val_lens`` adds validation losses at other
lengths; ``eval_lens`` are the lengths the final model is evaluated at.
"""

from __future__ import annotations

import numpy as np

#: Keys the NumPy generator of each step's length under ``train.length_order=random`` (with seed, step).
TRAIN_LENGTH_STREAM = 0x1E46


def eval_lens_of(cfg) -> list[int]:
    return list(cfg.eval_lens) if cfg.eval_lens is not None else [cfg.train_len * m for m in (1, 2, 4, 8, 16)]


#: What ``null`` means for each list of lengths, said when one is given empty.
NULL_LENGTHS = {
    "eval_lens": "train_len x 1, 2, 4, 8, 16",
    "train.lengths": "train_len alone",
    "train.val_lens": "train_len alone",
}


def lengths_problems(key: str, values: list) -> list[str]:
    """A list of lengths: not empty, positive integers, none twice (one problem at most: each rule reads the
    list as the one before left it)."""
    if not values:
        return [f"{key}=[] holds no length; give at least one ({key}=null: {NULL_LENGTHS[key]})"]
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        return [f"{key} must hold positive integers, got {values if key in NULL_LENGTHS else values[0]}"]
    if len(set(values)) < len(values):  # a length measured twice would be written twice under one key
        return [f"{key} must not repeat a length, got {values}"]
    return []


def train_lengths_of(cfg) -> list[int]:
    """The lengths a run trains at, shortest first: ``train.lengths``, or train_len alone."""
    return sorted(cfg.train.lengths) if cfg.train.lengths is not None else [cfg.train_len]


LENGTH_ORDERS = ("random", "curriculum")


def train_lengths_label(cfg) -> str:
    """results.csv's ``train_lengths``: ``64|128|256`` in random order, ``64>128>256`` as a curriculum (the
    order is part of how the model was trained, so the report keeps the two apart), ``256`` alone."""
    return (">" if cfg.train.length_order == "curriculum" else "|").join(map(str, train_lengths_of(cfg)))


def train_lengths_problems(cfg) -> list[str]:
    """``train.lengths``: positive, distinct, longest = train_len, each keeping tokens per step equal."""
    t = cfg.train
    if t.length_order not in LENGTH_ORDERS:
        return [f"train.length_order must be one of {', '.join(LENGTH_ORDERS)}, got {t.length_order!r}"]
    if t.lengths is None:
        if t.length_order != "random":  # one length has no order: the curriculum would be silently ignored
            return [f"train.length_order={t.length_order} orders train.lengths, which is not given"]
        return []
    lengths = list(t.lengths)
    found = lengths_problems("train.lengths", lengths)
    if found:  # the rules below divide by the lengths
        return found
    if max(lengths) != cfg.train_len:
        found.append(
            f"train.lengths={lengths} needs train_len={max(lengths)}, its longest (the length results.csv "
            f"names and the model is built for), got train_len={cfg.train_len}"
        )
    tokens = t.batch_size * cfg.train_len
    uneven = [length for length in lengths if tokens % length]
    if uneven:
        found.append(
            f"train.lengths: {uneven} cannot keep tokens per step equal: each length must divide "
            f"train.batch_size x train_len = {tokens}"
        )
    return found


def val_lens_of(cfg) -> list[int]:
    """The lengths a validation check measures beside train_len (``train.val_lens``), shortest first."""
    return sorted(cfg.train.val_lens) if cfg.train.val_lens is not None else []


def step_length(cfg, step: int) -> int:
    """The sequence length of ``step`` (from 1): ``train.copy_warmup_len`` in the copy warm-up where it is given;
    else train_len, or one of ``train.lengths`` by ``train.length_order``."""
    if step <= cfg.train.copy_warmup_steps and cfg.train.copy_warmup_len is not None:
        return cfg.train.copy_warmup_len
    lengths = train_lengths_of(cfg)
    if cfg.train.length_order == "curriculum":  # Shortformer's stages: equal shares of the steps, shortest first
        return lengths[(step - 1) * len(lengths) // cfg.train.steps]
    # drawn from (seed, step) alone, not a running generator: a resumed run redoes the same lengths
    return lengths[np.random.default_rng([TRAIN_LENGTH_STREAM, cfg.seed, step]).integers(len(lengths))]


def counts_for_patience(cfg, step: int) -> bool:
    """Whether a validation at ``step`` counts toward train.patience: always, except in a curriculum's shorter
    stages and in the copy warm-up (``train.copy_warmup_steps``), where the loss at train_len may stall and
    would stop the run before it ever trains at train_len, or on text."""
    if step <= cfg.train.copy_warmup_steps:
        return False
    return cfg.train.length_order != "curriculum" or step_length(cfg, step) == cfg.train_len


def step_lengths_of(cfg) -> list[int]:
    """Every length a step may train at: ``train_lengths_of`` and the copy warm-up's."""
    warmup = [cfg.train.copy_warmup_len] if cfg.train.copy_warmup_steps and cfg.train.copy_warmup_len else []
    return sorted({*train_lengths_of(cfg), *warmup})


def batch_rows(cfg, length: int) -> int:
    """Sequences per step at ``length``: whatever the length, a step holds train.batch_size x train_len tokens."""
    return cfg.train.batch_size * cfg.train_len // length
