"""``python -m posbench COMMAND ...``: dispatch a command word, turn bad input into one line and exit 2.

Hydra parses everything after the command word, so ``python -m posbench -m train encoding=alibi,rope``
and ``python -m posbench train -m encoding=alibi,rope`` both sweep.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import sys
from pathlib import Path
from typing import Callable

from .errors import PosbenchError

USAGE = """usage: python -m posbench [-m] COMMAND [ARGS...]

Which position encoding lets a Transformer LM read past its training length?

commands:
  train    train one LM and write perplexity at every evaluation length
           (Hydra overrides, e.g. encoding=rope experiment=quick data.path=DIR;
           -m sweeps comma-separated values; `train --help` shows the config groups)
  eval     evaluate a saved run again without retraining: checkpoint=PATH 'eval_lens=[...]'
           eval.mode=sliding eval.stride=S, rope.scaling.type=linear|ntk|dynamic|yarn rope.scaling.factor=F
  report   DIR: tables (summary.md, summary.csv: mean ± std over seeds) and figures (ppl_vs_length,
           per_position_loss, training_curves; PNG and SVG) from every run below DIR
  bench    speed and memory of every encoding x attention backend (bench.csv, bench.md)

Run `python -m posbench COMMAND --help` for a command's options.
"""

HYDRA_INFO_FLAGS = {"-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "-p", "--package", "--shell-completion", "-sc"}


def fail(message: str) -> int:
    print(f"posbench: error: {message}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def one_line_errors(debug: bool, run_dir: Path | None = None):
    """Turn a PosbenchError or Ctrl-C into one line on stderr and exit code 2 (full traceback with debug=true).

    Given the run's folder, the line also goes to its error.txt, so that ``report`` can say why the run stopped.
    """
    from .io import ERROR_FILE, write_text

    if run_dir is not None:
        (run_dir / ERROR_FILE).unlink(missing_ok=True)  # a resumed run starts with a clean slate
    try:
        yield
    except (PosbenchError, KeyboardInterrupt) as e:
        message = str(e) if isinstance(e, PosbenchError) else "interrupted (Ctrl-C)"
        if run_dir is not None:
            write_text(f"{message}\n", run_dir / ERROR_FILE)
        if debug:
            raise
        raise SystemExit(fail(message)) from None


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


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Every job's override list of a basic-sweeper multirun."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None) for job in batch]


def validate_overrides(config_name: str, overrides: list[str], multirun: bool, check: Callable | None) -> None:
    """Compose the config of every job up front, so a typo fails in a second, not an hour into a sweep."""
    from hydra import compose, initialize_config_dir

    from .config import CONFIG_DIR, register_configs

    register_configs()  # the schemas the YAML files name
    try:
        jobs = expand_sweep(overrides) if multirun else [overrides]
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name=config_name):
            for job in jobs:
                cfg = compose(config_name, overrides=job)
                if check:
                    check(cfg)
            if multirun:
                check_launcher(compose(config_name, overrides=jobs[0], return_hydra_config=True).hydra.launcher)
    except PosbenchError:
        raise
    except Exception as e:  # Hydra/OmegaConf composition and parse errors
        raise PosbenchError(condense_hydra_error(e)) from None


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


def run_hydra(config_name: str, task: Callable, args: list[str], check: Callable | None = None) -> int:
    """Validate the overrides, then hand ``args`` to a ``@hydra.main`` function running ``task(cfg, run_dir)``."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from .config import CONFIG_DIR, register_configs
    from .distributed import hydra_run_args

    register_configs()
    if not HYDRA_INFO_FLAGS & set(args):
        multirun = "-m" in args or "--multirun" in args
        overrides = [a for a in args if not a.startswith("-")]
        try:
            validate_overrides(config_name, overrides, multirun, check)
            args = hydra_run_args(config_name, args)  # under torchrun: rank 0's run folder for every rank
        except PosbenchError as e:
            if "debug=true" in (o.lower() for o in overrides):
                raise
            return fail(str(e))

    @hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")
    def _main(cfg) -> None:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        with one_line_errors(cfg.get("debug", False), run_dir):
            task(cfg, run_dir)

    sys.argv = [f"posbench {config_name}", *args]
    _main()
    return 0


def cmd_train(args: list[str]) -> int:
    from .config import check_config
    from .train import train

    return run_hydra("train", train, args, check=check_config)


def cmd_eval(args: list[str]) -> int:
    from .reevaluate import check_command, eval_command, register

    register()
    return run_hydra("eval", eval_command, args, check=check_command)


def cmd_report(args: list[str]) -> int:
    from .report import report

    parser = argparse.ArgumentParser(prog="python -m posbench report", description="Tables and figures from a folder of runs.")
    parser.add_argument("dir", help="a run or multirun folder, searched recursively for results.csv")
    ns = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors(debug=False):
        out = report(ns.dir)
    print(f"report written to {out}")
    return 0


def cmd_bench(args: list[str]) -> int:
    from .bench import bench, register_bench_config

    register_bench_config()
    return run_hydra("bench", bench, args)


COMMANDS: dict[str, Callable[[list[str]], int]] = {"train": cmd_train, "eval": cmd_eval, "report": cmd_report, "bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    position = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if position is None:
        if not argv or argv[0] in ("-h", "--help"):
            print(USAGE)
            return 0
        return fail(f"unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)} (see --help)")
    command = argv.pop(position)
    try:
        return COMMANDS[command](argv)
    except KeyboardInterrupt:  # Ctrl-C outside a run (composing, loading): one line, no traceback
        return fail("interrupted (Ctrl-C)")
