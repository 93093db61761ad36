"""The commands of ``python -m posbench``: one module each, all of one shape; ``cli.COMMANDS`` is their table.

A command module has

* its config dataclass: the structured config its YAML file (``conf/NAME.yaml``) is checked against;
* ``register()``: puts that dataclass (and the schemas its YAML names) into Hydra's ConfigStore;
* ``check(cfg)``: every problem of one job's config at once, as one ``ProblemsFound`` (``errors.Problems``),
  before anything is loaded;
* ``run(cfg, run_dir)``: the job, in its run folder, on a config that ``check`` passed;

and may have ``check_jobs(configs, overrides, multirun)`` (checks across the jobs of one command line) and
``sweep_args(overrides)`` (Hydra words a sweep adds). ``commands.launch`` composes and checks every job, then
runs them through Hydra. A command whose words are not Hydra overrides (``report DIR``) has ``parse(args)``
instead of ``register``, and ``run(cfg)``.

Library code (training, evaluation, the probes, the report) never imports from here: a command is the thin
layer between the command line and the library, and tests call the library directly.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def command(name: str) -> ModuleType:
    """The module of command ``name`` (``posbench.commands.train``, ...)."""
    return importlib.import_module(f"{__name__}.{name}")
