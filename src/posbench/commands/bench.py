"""``posbench bench``: training and evaluation speed and memory of every encoding x attention backend (``bench/``
measures; bench.csv and bench.md in the run folder). Random tokens, so it needs no data."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from ..bench import BenchConfig, bench
from ..errors import Problems
from ..model import ModelConfig, build_problems
from ..positional import ENCODINGS
from ..runtime import check_precision, resolve_device


def register() -> None:
    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


def check(cfg) -> None:
    """Every number and name bench takes, checked before anything is measured; all problems at once."""
    problems = Problems()
    problems.add(f"{key} must be a positive integer, got {cfg[key]}" for key in POSITIVE if cfg[key] < 1)
    problems.add(f"{key} must be 0 or more, got {cfg[key]}" for key in ("train_steps", "warmup") if cfg[key] < 0)
    for key in ("encodings", "backends", "precisions"):
        problems.add(bench_list_problems(key, cfg[key]))
    if cfg.eval_lens or not cfg.train_steps:  # eval_lens=[] times training alone
        problems.add(bench_list_problems("eval_lens", cfg.eval_lens))
    if any(n < 1 for n in cfg.eval_lens):
        problems.add([f"eval_lens must hold positive integers, got {list(cfg.eval_lens)}"])
    unknown = [e for e in cfg.encodings or () if e not in ENCODINGS]
    if unknown:
        problems.add([f"encodings: unknown {unknown}; choices: {', '.join(ENCODINGS)}"])
    problems.run(resolve_device, cfg.device)
    for precision in cfg.precisions:
        problems.run(check_precision, precision)
    models = [ModelConfig(**{**OmegaConf.to_container(cfg.model), "attention": backend}) for backend in cfg.backends]
    encodings = [ENCODINGS[name][0]() for name in cfg.encodings or ENCODINGS if name in ENCODINGS]
    built = [build_problems(model, encoding, cfg.train_len) for model in models for encoding in encodings]
    problems.add(dict.fromkeys(p for found in built for p in found))  # a model's problem once, not once per pair
    problems.raise_any()


#: The numbers of bench that must be at least 1.
POSITIVE = ("vocab_size", "train_batch", "train_len", "eval_repeats")


def bench_list_problems(key: str, values) -> list[str]:
    """A list of what to measure names something, each once: ``[]`` would measure nothing (or, for encodings,
    everything, as ``null`` does) and a repeat would measure the same thing twice."""
    if values is None:  # encodings=null: every encoding
        return []
    values = list(values)
    if not values:
        every = "; encodings=null measures every encoding" if key == "encodings" else ""
        alone = " (with train_steps=0 nothing is trained either)" if key == "eval_lens" else ""
        return [f"{key}=[] names nothing to measure{alone}{every}"]
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        return [f"{key} names {', '.join(repeated)} more than once, got {values}"]
    return []


def run(cfg, run_dir: Path) -> pd.DataFrame:
    """Measure; bench.csv and bench.md go into ``run_dir``."""
    return bench(cfg, run_dir)
