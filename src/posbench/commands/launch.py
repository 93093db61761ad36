"""Launching a command that reads Hydra overrides: every job's config checked up front, then Hydra runs the jobs.

``launch`` composes and checks the config of every job before the first starts (a typo fails in a second,
not an hour into a sweep), then hands the words to ``hydra_job``, the one Hydra main function of posbench:
it finds the command by the name of its config (``hydra.job.config_name``: train, eval, ...) and runs its
``run(cfg, run_dir)``, alone or as one job of a sweep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from .. import sweep
from ..config import CONFIG_DIR
from ..errors import PosbenchError, fail, one_line_errors
from . import command

#: Hydra's flags that show something (help, the config) instead of running a job: nothing is checked first.
HYDRA_INFO_FLAGS = {
    "-h",
    "--help",
    "--hydra-help",
    "--info",
    "-i",
    "--cfg",
    "-c",
    "--resolve",
    "-p",
    "--package",
    "--shell-completion",
    "-sc",
}


def launch(name: str, args: list[str]) -> int:
    """``python -m posbench NAME ARGS``: check every job, then run them through Hydra; under torchrun, leave the
    process group at the end, whatever happened."""
    from ..distributed import teardown

    try:
        return _launch(name, args)
    finally:
        teardown()


def _launch(name: str, args: list[str]) -> int:
    from ..distributed import hydra_run_args

    module = command(name)
    module.register()
    overrides = [a for a in args if not a.startswith("-")]
    debug = "debug=true" in (o.lower() for o in overrides)
    if not HYDRA_INFO_FLAGS & set(args):
        multirun = "-m" in args or "--multirun" in args
        try:
            validate_overrides(name, overrides, multirun)
            if multirun and hasattr(module, "sweep_args"):
                args = [*args, *module.sweep_args(overrides)]
            args = hydra_run_args(name, args)  # under torchrun: rank 0's run folder for every rank
        except PosbenchError as e:
            if debug:
                raise
            return fail(str(e))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's own failures (e.g. making a folder) reach one_line_errors
    sweep.SweepSummary.failures = 0
    try:
        with one_line_errors(debug), hydra_argv(name, args):
            hydra_job()
    except sweep.SweepStopped as stop:  # Hydra skipped on_multirun_end: the summary, then the signal's line
        sweep.summarize(stop.sweep_dir, overrides, stopped=True)
        return fail(stop.message)
    if sweep.SweepSummary.failures:
        return fail(f"{sweep.SweepSummary.failures} job(s) of the sweep failed (listed above)")
    return 0


@contextlib.contextmanager
def hydra_argv(name: str, args: list[str]):
    """``sys.argv`` as Hydra's main function reads it, for the time of one call: Hydra takes its overrides, flags
    and config name from ``sys.argv`` alone (its public API has no other way in that also runs the sweeper, the
    launcher and the callbacks). ``--config-name`` names the command's config; ``posbench NAME`` is what
    Hydra's help shows as the program."""
    saved, sys.argv = sys.argv, [f"posbench {name}", f"--config-name={name}", *args]
    try:
        yield
    finally:
        sys.argv = saved


@hydra.main(config_path=str(CONFIG_DIR), config_name=None, version_base="1.3")
def hydra_job(cfg) -> None:
    """One job: the command whose config Hydra composed runs it, in the job's run folder; a job of a sweep that
    fails is recorded and the sweep goes on (``sweep.run_job``). The job's log begins with its command and
    overrides: a later eval or probe of the same run replaces the folder's .hydra/eval (or probe) record, and
    the log, which grows, keeps what each one was asked."""
    hydra_cfg = HydraConfig.get()
    logging.getLogger(__name__).info("posbench %s %s", hydra_cfg.job.config_name, " ".join(hydra_cfg.overrides.task))
    run, run_dir = command(hydra_cfg.job.config_name).run, Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep.run_job(run, cfg, run_dir, Path(hydra_cfg.sweep.dir))
        return
    with one_line_errors(cfg.get("debug", False)):
        run(cfg, run_dir)


def validate_overrides(name: str, overrides: list[str], multirun: bool) -> None:
    """Compose the config of every job of command ``name`` and ``check`` it (the command's ``check_jobs``, if it
    has one, then sees them all), so a typo fails in a second, not an hour into a sweep."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import OverrideParseException

    module = command(name)
    module.register()  # the schemas its YAML file names
    try:
        check_hydra_sweeps(overrides, multirun)
        jobs = sweep.expand_sweep(overrides) if multirun else [overrides]
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name=name):
            configs = [compose(name, overrides=job) for job in jobs]
            for cfg in configs:
                module.check(cfg)
            if multirun:
                check_launcher(compose(name, overrides=jobs[0], return_hydra_config=True).hydra.launcher)
        if hasattr(module, "check_jobs"):
            module.check_jobs(configs, overrides, multirun)
    except PosbenchError:
        raise
    except OverrideParseException as e:
        key = e.override.split("=")[0]
        raise PosbenchError(
            f"{key}: cannot read {e.override!r} ({condense_hydra_error(e).split('; See https')[0]}); a value holding "
            f"spaces, commas or characters such as ~ & = ( ) needs quotes for Hydra too: \"{key}='VALUE'\""
        ) from None
    except Exception as e:  # Hydra/OmegaConf composition and parse errors
        raise PosbenchError(condense_hydra_error(e)) from None


def condense_hydra_error(e: Exception) -> str:
    """Hydra's multi-line composition errors as one line, valid choices included."""
    noise = ("full_key:", "object_type", "reference_type", "Set the environment", "To append", "msg:")
    text = str(e) if e.__cause__ is None else f"{e}\n{e.__cause__}"
    text = text.split("Config search path")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(noise)]
    if not lines:
        return type(e).__name__
    lines = [line.rstrip(":.") for line in lines]
    head, rest = lines[0], lines[1:]
    if rest and rest[0].startswith("Available options"):
        options = [o for o in rest[1:] if not o.startswith("schema")]
        return f"{head}; valid choices in {rest[0].split('in ', 1)[-1].rstrip(':')}: {', '.join(options)}"
    return "; ".join([head, *rest])


def check_hydra_sweeps(overrides: list[str], multirun: bool) -> None:
    """Under -m a comma sweeps; Hydra's own settings (hydra.run.dir, a path with a comma) cannot be swept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not multirun:
        return
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.key_or_group.startswith("hydra.") and o.is_sweep_override():
            raise PosbenchError(
                f"{o.key_or_group}: a comma makes a sweep, and Hydra's own settings cannot be swept; "
                f"to keep the comma in the value, quote it: \"{o.input_line.split('=')[0]}='VALUE'\""
            )


def check_launcher(launcher) -> None:
    """A SLURM sweep started off a SLURM cluster stops here in one line, not in submitit's traceback."""
    if not str(launcher.get("_target_", "")).endswith("SlurmLauncher"):
        return
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if missing:
        raise PosbenchError(
            f"hydra/launcher=slurm needs a SLURM cluster, but {' and '.join(missing)} is not on PATH here; "
            "run the sweep from a login node, or drop the launcher (joblib or the default) to run here"
        )


def command_line_keys() -> list[str]:
    """The keys set on the command line of the running job: those of Hydra's task overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [o.key_or_group for o in OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task))]
