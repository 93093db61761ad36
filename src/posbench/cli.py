"""``python -m posbench COMMAND ...``: dispatch a command word, turn bad input into one line and exit 2.

Hydra parses everything after the command word, so ``python -m posbench -m train encoding=alibi,rope``
and ``python -m posbench train -m encoding=alibi,rope`` both sweep.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import Callable

from .errors import PosbenchError

USAGE = """usage: python -m posbench [-m] COMMAND [ARGS...]

Which position encoding lets a Transformer LM read past its training length?

commands:
  train    train one LM and write perplexity at every evaluation length
           (Hydra overrides, e.g. encoding=rope experiment=quick data.path=DIR;
           -m sweeps comma-separated values; `train --help` shows the config groups)
  report   DIR: tables (summary.md, results.csv) and ppl_vs_length.png from every run below DIR

Run `python -m posbench COMMAND --help` for a command's options.
"""

HYDRA_INFO_FLAGS = {"-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "-p", "--package", "--shell-completion", "-sc"}


def fail(message: str) -> int:
    print(f"posbench: error: {message}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def one_line_errors(debug: bool):
    """Turn a PosbenchError into one line on stderr and exit code 2 (full traceback with debug=true)."""
    try:
        yield
    except PosbenchError as e:
        if debug:
            raise
        raise SystemExit(fail(str(e))) from None


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

    from .config import CONFIG_DIR

    try:
        jobs = expand_sweep(overrides) if multirun else [overrides]
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name=config_name):
            for job in jobs:
                cfg = compose(config_name, overrides=job)
                if check:
                    check(cfg)
    except PosbenchError:
        raise
    except Exception as e:  # Hydra/OmegaConf composition and parse errors
        raise PosbenchError(condense_hydra_error(e)) from None


def run_hydra(config_name: str, task: Callable, args: list[str], check: Callable | None = None) -> int:
    """Validate the overrides, then hand ``args`` to a ``@hydra.main`` function running ``task(cfg, run_dir)``."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from .config import CONFIG_DIR, register_configs

    register_configs()
    if not HYDRA_INFO_FLAGS & set(args):
        multirun = "-m" in args or "--multirun" in args
        overrides = [a for a in args if not a.startswith("-")]
        try:
            validate_overrides(config_name, overrides, multirun, check)
        except PosbenchError as e:
            if "debug=true" in overrides:
                raise
            return fail(str(e))

    @hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")
    def _main(cfg) -> None:
        with one_line_errors(cfg.get("debug", False)):
            task(cfg, HydraConfig.get().runtime.output_dir)

    sys.argv = [f"posbench {config_name}", *args]
    _main()
    return 0


def cmd_train(args: list[str]) -> int:
    from .config import check_config
    from .train import train

    return run_hydra("train", train, args, check=check_config)


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


COMMANDS: dict[str, Callable[[list[str]], int]] = {"train": cmd_train, "report": cmd_report}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    position = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if position is None:
        if not argv or argv[0] in ("-h", "--help"):
            print(USAGE)
            return 0
        return fail(f"unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)} (see --help)")
    command = argv.pop(position)
    return COMMANDS[command](argv)
