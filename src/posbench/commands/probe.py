"""``posbench probe``: run the probes (docs/probes.md) on a saved run, without retraining.

The run is loaded as ``posbench eval`` loads it (``saved_run.load_run``): its own config, with the keys given on
the command line replacing its values. ``probes=[...]`` (default: all four) and ``probe.*`` come from the
command line alone. Rows are merged into the run's folder, or ``hydra.run.dir=DIR``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from omegaconf import DictConfig

from ..errors import raise_problems
from ..probes.config import PROBES, ProbeConfig, probes_problems
from ..probes.suite import check_probe_data, run_probes
from ..runfolder import lock_run_dir
from ..saved_run import load_run
from ..sweep import checkpoint_sweep_args
from . import eval as eval_command
from .launch import command_line_keys


@dataclass
class ProbeCommandConfig(eval_command.EvalCommandConfig):
    #: The probes to run, of context, window, copy, attention.
    probes: List[str] = field(default_factory=lambda: list(PROBES))
    probe: ProbeConfig = field(default_factory=ProbeConfig)


def register() -> None:
    eval_command.register("probe", ProbeCommandConfig)


def check(cfg: DictConfig) -> None:
    """What can be checked before loading anything, all at once: the checkpoint, ``eval.*``, the probes and
    ``probe.*``."""
    found = eval_command.saved_run_problems(cfg)
    if not cfg.probes:  # for train, probes=[] skips the probes; here it would make a command that does nothing
        found.append("probes=[] names no probe for posbench probe to run; leave it out for all of them")
    raise_problems(found + probes_problems(cfg.probes, cfg.probe))


def sweep_args(overrides: list[str]) -> list[str]:
    """``-m probe checkpoint=A,B``: each job writes into its own run's folder (``sweep.checkpoint_sweep_args``)."""
    return checkpoint_sweep_args("probe", overrides)


def probe_checkpoint(command: DictConfig, keys: list[str], out_dir: Path, checked: bool = False) -> None:
    """Run ``command.probes`` on ``command.checkpoint`` (``keys`` of ``command`` overridden) into ``out_dir``;
    ``checked`` as for ``eval.evaluate_checkpoint``."""
    if not checked:
        check(command)
    run = load_run(command, keys)
    run.cfg.probes, run.cfg.probe = command.probes, command.probe
    check_probe_data(run.corpus, run.cfg, run.device)
    with lock_run_dir(Path(out_dir)):
        run.taken_into(Path(out_dir))
        run_probes(run.model, run.corpus, run.cfg, run.device, Path(out_dir), run.state)


def run(cfg: DictConfig, run_dir: Path) -> None:
    """Probe with the keys given on the command line."""
    probe_checkpoint(cfg, command_line_keys(), Path(run_dir), checked=True)
