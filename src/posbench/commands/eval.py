"""``posbench eval``: evaluate a saved run again, at other lengths, in another mode or in another variant.

The run's own config (from its checkpoint) is the starting point; only the keys given on the command line
replace it (``saved_run.load_run``). Rows go to the run's results.csv, per_position.csv and per_article.csv (a
task run's to task_results.csv), merged by the identity of a row (``runfolder.merge_rows``: the run, the state of
its weights, and split, eval_len, eval_mode, stride, variant and precision); ``hydra.run.dir=DIR`` writes to DIR
instead, beside the rows of other runs there. ``probe`` and ``generate`` load a run the same way, and their
configs extend this one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import List, Optional

import pandas as pd
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from ..config import EvalConfig, eval_problems
from ..data import DataConfig
from ..errors import raise_problems
from ..evaluate import evaluate_lengths
from ..positional import variant_namespaces
from ..runfolder import CHECKPOINT, RESULTS, TASK_RESULTS, lock_run_dir, merge_rows
from ..saved_run import load_run, run_folder
from ..sweep import checkpoint_sweep_args
from ..tasks import build_task
from ..tasks.measure import measured
from .launch import command_line_keys

log = logging.getLogger(__name__)


@dataclass
class EvalModelConfig:
    #: Log-n attention scaling (``model.logn_scaling``): it changes no weight, so a run trained
    #: without it can be evaluated with it (rows get ``variant=logn``).
    logn_scaling: bool = False


@dataclass
class EvalCommandConfig:
    #: A checkpoint.pt, or the run folder holding one.
    checkpoint: str = MISSING
    #: ``null``: the run's own lengths.
    eval_lens: Optional[List[int]] = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    model: EvalModelConfig = field(default_factory=EvalModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    device: str = "auto"
    #: ``auto``, ``fp32`` or ``bf16`` (see ``Config.precision``); like every key, used only when given.
    precision: str = "auto"
    #: Torch CPU threads (``null``: torch's default); set 1 when N evaluations share N cores.
    threads: Optional[int] = None
    debug: bool = False


def schema(base: type = EvalCommandConfig) -> type:
    """``base`` plus one namespace per encoding with evaluation-time options (``rope.scaling``)."""
    namespaces = [(name, options, field(default_factory=options)) for name, options in variant_namespaces().items()]
    return make_dataclass(f"{base.__name__}Schema", namespaces, bases=(base,))  # its name shows in Hydra's errors


def register(name: str = "eval", base: type = EvalCommandConfig) -> None:
    """Store the schema of a command that loads a saved run (``eval``, ``probe``, ``generate``) as
    ``NAME_schema``."""
    ConfigStore.instance().store(name=f"{name}_schema", node=schema(base))
    OmegaConf.register_new_resolver("posbench_run_dir", run_folder, replace=True)


def saved_run_problems(cfg) -> list[str]:
    """What can be checked of a command that loads a saved run before loading anything: the checkpoint and
    ``eval.*``."""
    found = eval_problems(cfg.eval)
    if OmegaConf.is_missing(cfg, "checkpoint"):
        return ["eval needs checkpoint=PATH (a checkpoint.pt or the run folder holding one)", *found]
    path = Path(cfg.checkpoint)
    if path.is_dir() and not (path / CHECKPOINT).is_file():
        found.insert(0, f"checkpoint={path}: the folder holds no {CHECKPOINT} (a run saves it at its first validation)")
    elif not path.is_dir() and not path.is_file():
        found.insert(0, f"checkpoint {path} does not exist")
    return found


def check(cfg) -> None:
    """Every problem of ``saved_run_problems`` at once."""
    raise_problems(saved_run_problems(cfg))


def sweep_args(overrides: list[str]) -> list[str]:
    """``-m eval checkpoint=A,B``: each job writes into its own run's folder (``sweep.checkpoint_sweep_args``)."""
    return checkpoint_sweep_args("eval", overrides)


def evaluate_checkpoint(command: DictConfig, keys: list[str], out_dir: Path, checked: bool = False) -> pd.DataFrame:
    """Evaluate ``command.checkpoint`` with ``keys`` of ``command`` overridden; merge rows into ``out_dir``.

    ``checked``: ``check`` has run on ``command`` (``posbench eval`` runs it on every job before the first
    starts); a direct call leaves it False, and the command is checked here."""
    if not checked:
        check(command)
    run = load_run(command, keys)
    out_dir = Path(out_dir)
    with lock_run_dir(out_dir):
        run.taken_into(out_dir)
        if run.cfg.task:
            task = build_task(run.cfg.task)
            name, results = TASK_RESULTS, measured(run.model, task, run.cfg, run.device, run.as_trained())
            merge_rows(out_dir, name, results, run.state)
        else:  # merges each length's rows as it measures it
            name, results = RESULTS, evaluate_lengths(run.model, run.corpus, run.cfg, run.device, out_dir, run.state)
    log.info("%d rows written to %s", len(results), out_dir / name)
    return results


def run(cfg: DictConfig, run_dir: Path) -> pd.DataFrame:
    """Evaluate with the keys given on the command line."""
    return evaluate_checkpoint(cfg, command_line_keys(), Path(run_dir), checked=True)
