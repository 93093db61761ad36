"""``posbench generate``: sample continuations from a saved run past its training length (``generate.py`` says
how, and what samples.jsonl and generation.csv hold).

The run is loaded as ``posbench eval`` loads it (``saved_run.load_run``): its own config, with the keys given on
the command line replacing its values, so the evaluation-time variants apply as there. ``generate.*`` comes from
the command line alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from ..errors import raise_problems
from ..generate import GenerateConfig, generate_problems, generate_samples, length_problems, lengths
from ..runfolder import GENERATION, SAMPLES, lock_run_dir, merge_records, merge_rows
from ..saved_run import load_run
from . import eval as eval_command
from .launch import command_line_keys

log = logging.getLogger(__name__)


@dataclass
class GenerateCommandConfig(eval_command.EvalCommandConfig):
    generate: GenerateConfig = field(default_factory=GenerateConfig)


def register() -> None:
    eval_command.register("generate", GenerateCommandConfig)


def check(cfg: DictConfig) -> None:
    """What can be checked before loading anything, all at once: the checkpoint, ``eval.*`` and ``generate.*``."""
    g = cfg.generate
    raise_problems(eval_command.saved_run_problems(cfg) + generate_problems(g) + length_problems(g, None))


def generate_checkpoint(command: DictConfig, keys: list[str], out_dir: Path, checked: bool = False) -> pd.DataFrame:
    """Generate from ``command.checkpoint`` (``keys`` of ``command`` overridden) into ``out_dir``; returns the
    generation.csv rows written. ``checked`` as for ``eval.evaluate_checkpoint``."""
    if not checked:
        check(command)
    run = load_run(command, keys)
    g = command.generate
    if None in lengths(g, None):  # a length waited for the run's train_len: its rule runs now
        raise_problems(length_problems(g, run.cfg.train_len))
    out_dir = Path(out_dir)
    with lock_run_dir(out_dir):
        run.taken_into(out_dir)  # a file that cannot take rows fails before sampling
        records, table = generate_samples(run.model, run.corpus, run.cfg, g, run.device)
        merge_rows(out_dir, GENERATION, table, run.state)
        merge_records(out_dir, records, run.state)
    onsets = [r["degeneration_onset"] for r in records if r["degeneration_onset"] is not None]
    log.info("%d samples written to %s; degeneration onset in %d", len(records), out_dir / SAMPLES, len(onsets))
    return table


def run(cfg: DictConfig, run_dir: Path) -> pd.DataFrame:
    """Generate with the keys given on the command line, but for ``generate.*`` (not the run's config)."""
    keys = [key for key in command_line_keys() if key.split(".")[0] != "generate"]
    return generate_checkpoint(cfg, keys, Path(run_dir), checked=True)
