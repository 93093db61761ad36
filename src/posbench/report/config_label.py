"""The config label of a run: the config keys that set it apart from the other runs of its line (runs
with the same encoding, training variant, train_len, precision and training lengths). Keys that change no
number (``CONFIG_IGNORED``) are not counted, so only seeds are averaged. Configs are read on today's schema, as
resume reads them: a key added since a run was trained reads as its default, which is what that run did."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pandas as pd
from omegaconf import OmegaConf

from ..config import config_on_schema
from ..errors import PosbenchError
from ..evaluate import variant_parts
from ..resume import flatten
from ..runfolder import RESULTS, run_configs
from .runs import Run

#: Config keys that change no number of a run, or that a line already names (its seeds are averaged).
CONFIG_IGNORED = (
    *("seed", "debug", "device", "threads", "logger", "precision", "probes", "probe", "eval", "train.resume"),
    *("train.checkpoint_every", "train.val_lens", "encoding.name", "train_len", "train.lengths", "train.length_order"),
    "encoding.randomized_positions",
)


def told_apart(runs: list[Run]) -> list[Run]:
    """``runs`` with their ``config`` label: the keys in which a run's config differs from the others of its
    line (seeds aside); "" where they agree, or a config is not known."""
    configs, by_folder = {}, {}
    for run in runs:
        if run.folder not in by_folder:  # a folder may hold several runs: its configs are read once
            by_folder[run.folder] = run_configs(run.folder)
        saved = by_folder[run.folder].get(run.run_id)
        configs[id(run)] = result_changing(saved) if isinstance(saved, dict) else None
    lines: dict[tuple, list[Run]] = {}
    for run in runs:
        lines.setdefault(trained_line(run), []).append(run)
    labelled = {}
    for members in lines.values():
        known = [configs[id(run)] for run in members if configs[id(run)] is not None]
        differing = sorted(k for k in set().union(*known) if len({str(c.get(k)) for c in known}) > 1) if known else []
        for run in members:
            config = configs[id(run)]
            text = ",".join(f"{k}={config.get(k)}" for k in differing) if config is not None else ""
            labelled[id(run)] = replace(run, config=text)
    return [labelled[id(run)] for run in runs]


def result_changing(config: dict) -> dict:
    """A run's config on today's schema (as saved where it does not fit), flattened, without the keys of
    CONFIG_IGNORED."""
    with contextlib.suppress(PosbenchError):
        config = OmegaConf.to_container(config_on_schema(config), resolve=True)
    flat = flatten(config)
    return {k: v for k, v in flat.items() if not any(k == i or k.startswith(f"{i}.") for i in CONFIG_IGNORED)}


def trained_line(run: Run) -> tuple:
    """What a line names of how a run was trained: its encoding, training variant, train_len, precision, lengths."""
    first = run.tables[RESULTS].iloc[0]
    trained = variant_parts(str(first.get("variant", "") if pd.notna(first.get("variant", "")) else ""))[0]
    return (first["encoding"], trained, first["train_len"], run.precision, run.train_lengths)
