"""``posbench train``: train one LM (or, with ``task=...``, one synthetic task) and measure it.

The config is ``config.Config`` and its rules are ``config.config_problems``; training is ``train.train``.
This module adds what the command line needs: the schemas the YAML files name, and the checks across the jobs
of one command line (the run folder it names, the cost of a sweep).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore

from ..config import Config, check_config
from ..positional import ENCODINGS
from ..tasks import TASKS


def register() -> None:
    """``train_schema``, and a schema per encoding and per task that their YAML files name."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=Config)
    for name, (config_cls, _) in ENCODINGS.items():
        cs.store(group="schema/encoding", name=name, node=config_cls)
    for name, task_cls in TASKS.items():
        cs.store(group="schema/task", name=name, node=task_cls.config_class)


def check(cfg) -> None:
    """Every problem of one job's config at once (``config.config_problems``)."""
    check_config(cfg)


def check_jobs(configs: list, overrides: list[str], multirun: bool) -> None:
    """One run: the folder that ``hydra.run.dir`` names must be free for it. A sweep: its cost, said up front."""
    from ..costs import announce_sweep

    if multirun:
        announce_sweep(configs)
    else:
        check_run_folder(configs[0], overrides)


def check_run_folder(cfg, overrides: list[str]) -> None:
    """``train hydra.run.dir=DIR``: a folder that another process holds, or that holds a finished run of another
    config, is refused before Hydra rewrites its .hydra/ (a refused command changes nothing in the folder)."""
    from ..resume import finished_run
    from ..runfolder import check_free

    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    run_dir = Path(given[-1].strip("'\"")) if given else None
    if run_dir is None or not run_dir.is_dir():
        return
    check_free(run_dir)
    finished_run(cfg, run_dir)  # raises for a finished run of another config


def run(cfg, run_dir: Path) -> dict:
    """Train and measure (``train.train``) in ``run_dir``; ``check`` has already run on ``cfg``."""
    from ..train import train

    return train(cfg, run_dir, checked=True)
