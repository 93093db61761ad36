"""``python -m posbench COMMAND ...``: dispatch a command word, turn bad input into one line and exit 2.

Hydra parses everything after the command word, so ``python -m posbench -m train encoding=alibi,rope``
and ``python -m posbench train -m encoding=alibi,rope`` both sweep.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from . import sweep
from .errors import PosbenchError, fail, one_line_errors, outlive_closed_pipes

USAGE = """usage: python -m posbench [-m] COMMAND [ARGS...]

Which position encoding lets a Transformer LM read past its training length?

commands:
  train    train one LM and write perplexity at every evaluation length
           (Hydra overrides, e.g. encoding=rope experiment=quick data.path=DIR;
           -m sweeps comma-separated values; `train --help` shows the config groups;
           task=passkey|mqar|copy trains on a synthetic retrieval task instead, docs/tasks.md)
  eval     evaluate a saved run again without retraining: checkpoint=PATH 'eval_lens=[...]'
           eval.mode=sliding eval.stride=S, rope.scaling.type=linear|ntk|dynamic|yarn rope.scaling.factor=F
  probe    does a saved run read its context? checkpoint=PATH 'probes=[context,window,copy,attention]'
           (the default: all four; docs/probes.md), probe.targets=N probe.trials=N eval.window=W
  generate sample past the training length from a saved run, with a key/value cache: checkpoint=PATH
           generate.prompts=N generate.max_len=L generate.temperature=T generate.top_k=K generate.top_p=P
           (samples.jsonl, generation.csv: repetition, distinct-2, NLL per window; docs/generation.md)
  report   DIR: tables (summary.md, summary.csv: mean ± std over seeds) and figures (ppl_vs_length,
           per_position_loss, training_curves; PNG and SVG) from every run below DIR;
           DIR compare=ENCODING adds compare.csv: NLL differences against ENCODING with bootstrap CIs;
           variants=LIST and modes=LIST keep only those evaluations (e.g. variants=window256 modes=nonoverlapping)
  bench    speed and memory of every encoding x attention backend (bench.csv, bench.md)

Run `python -m posbench COMMAND --help` for a command's options.
"""

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


def validate_overrides(config_name: str, overrides: list[str], multirun: bool, check: Callable | None) -> None:
    """Compose the config of every job up front, so a typo fails in a second, not an hour into a sweep."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import OverrideParseException

    from .config import CONFIG_DIR, register_configs
    from .costs import announce_sweep

    register_configs()  # the schemas the YAML files name
    try:
        check_hydra_sweeps(overrides, multirun)
        jobs = sweep.expand_sweep(overrides) if multirun else [overrides]
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name=config_name):
            configs = [compose(config_name, overrides=job) for job in jobs]
            for cfg in configs:
                if check:
                    check(cfg)
            if config_name == "train" and not multirun:
                check_run_folder(cfg, overrides)
            if multirun:
                check_launcher(compose(config_name, overrides=jobs[0], return_hydra_config=True).hydra.launcher)
        if multirun and config_name == "train":
            announce_sweep(configs)
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


def check_run_folder(cfg, overrides: list[str]) -> None:
    """``train hydra.run.dir=DIR``: a folder that another process holds, or that holds a finished run of another
    config, is refused before Hydra rewrites its .hydra/ (a refused command changes nothing in the folder)."""
    from .resume import finished_run
    from .runfolder import check_free

    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    run_dir = Path(given[-1].strip("'\"")) if given else None
    if run_dir is None or not run_dir.is_dir():
        return
    check_free(run_dir)
    finished_run(cfg, run_dir)  # raises for a finished run of another config


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
    """Validate the overrides, then hand ``args`` to a ``@hydra.main`` function running ``task(cfg, run_dir)``;
    under torchrun, leave the process group at the end, whatever happened."""
    from .distributed import teardown

    try:
        return _run_hydra(config_name, task, args, check)
    finally:
        teardown()


def _run_hydra(config_name: str, task: Callable, args: list[str], check: Callable | None) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .config import CONFIG_DIR, register_configs
    from .distributed import hydra_run_args

    register_configs()
    overrides = [a for a in args if not a.startswith("-")]
    debug = "debug=true" in (o.lower() for o in overrides)
    if not HYDRA_INFO_FLAGS & set(args):
        multirun = "-m" in args or "--multirun" in args
        try:
            validate_overrides(config_name, overrides, multirun, check)
            if multirun and config_name in ("eval", "probe"):
                args = [*args, *sweep.checkpoint_sweep_args(config_name, overrides)]
            args = hydra_run_args(config_name, args)  # under torchrun: rank 0's run folder for every rank
        except PosbenchError as e:
            if debug:
                raise
            return fail(str(e))

    @hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3")
    def _main(cfg) -> None:
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            sweep.run_job(task, cfg, run_dir, Path(hydra_cfg.sweep.dir))
            return
        with one_line_errors(cfg.get("debug", False)):
            task(cfg, run_dir)

    sys.argv = [f"posbench {config_name}", *args]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's own failures (e.g. making a folder) reach one_line_errors
    sweep.SweepSummary.failures = 0
    try:
        with one_line_errors(debug):
            _main()
    except sweep.SweepStopped as stop:  # Hydra skipped on_multirun_end: the summary, then the signal's line
        sweep.summarize(stop.sweep_dir, overrides, stopped=True)
        return fail(stop.message)
    if sweep.SweepSummary.failures:
        return fail(f"{sweep.SweepSummary.failures} job(s) of the sweep failed (listed above)")
    return 0


def cmd_train(args: list[str]) -> int:
    from .config import check_config
    from .train import train

    return run_hydra("train", functools.partial(train, checked=True), args, check=check_config)


def cmd_eval(args: list[str]) -> int:
    from .reevaluate import check_command, eval_command, register

    register()
    return run_hydra("eval", eval_command, args, check=check_command)


def cmd_probe(args: list[str]) -> int:
    from .probe import check_probe_command, probe_command, register_probe

    register_probe()
    return run_hydra("probe", probe_command, args, check=check_probe_command)


def cmd_generate(args: list[str]) -> int:
    from .generate import check_generate_command, generate_command, register_generate

    register_generate()
    return run_hydra("generate", generate_command, args, check=check_generate_command)


def cmd_report(args: list[str]) -> int:
    from .report import report

    parser = argparse.ArgumentParser(
        prog="python -m posbench report", description="Tables and figures from a folder of runs."
    )
    parser.add_argument("dir", help="a run or multirun folder, searched recursively for results.csv")
    parser.add_argument(
        "options",
        nargs="*",
        metavar="KEY=VALUE",
        help="compare=ENCODING: NLL differences against ENCODING on the same articles, bootstrap CIs; "
        "variants=V1,V2: keep only these evaluation-time variants beside the models as trained "
        "(variants= keeps none); modes=M1,M2: keep only these eval modes (nonoverlapping, sliding)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    ns = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors(ns.debug):
        compare, selection = report_options(ns.options)
        out = report(ns.dir, compare=compare, selection=selection)
    print(f"report written to {out}")
    return 0


REPORT_OPTIONS = ("compare=ENCODING", "variants=LIST", "modes=LIST")


def report_options(words: list[str]):
    """The ``compare`` encoding (None without one) and the ``Selection`` of the KEY=VALUE words after
    ``report DIR``; each key once."""
    from .report import Selection

    given = {}
    for word in words:
        key, equals, value = word.partition("=")
        if key not in ("compare", "variants", "modes") or not equals or not (value or key == "variants"):
            raise PosbenchError(f"report takes DIR and {', '.join(REPORT_OPTIONS)}, not {word!r}")
        if key in given:
            raise PosbenchError(f"report: {key}= given twice")
        given[key] = value
    lists = {key: tuple(v for v in given[key].split(",") if v) for key in ("variants", "modes") if key in given}
    return given.get("compare"), Selection(**lists)


def cmd_bench(args: list[str]) -> int:
    from .bench import bench, check_bench, register_bench_config

    register_bench_config()
    return run_hydra("bench", bench, args, check=check_bench)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": cmd_train,
    "eval": cmd_eval,
    "probe": cmd_probe,
    "generate": cmd_generate,
    "report": cmd_report,
    "bench": cmd_bench,
}


def main(argv: list[str] | None = None) -> int:
    outlive_closed_pipes()
    argv = list(sys.argv[1:] if argv is None else argv)
    position = next((i for i, a in enumerate(argv) if a in COMMANDS), None)
    if position is None:
        if not argv or argv[0] in ("-h", "--help"):
            print(USAGE)
            return 0
        return fail(f"unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)} (see --help)")
    command = argv.pop(position)
    debug = any(a.lower() in ("debug=true", "--debug") for a in argv)
    with one_line_errors(debug):  # whatever escapes a command (composing, loading, Ctrl-C): one line
        return COMMANDS[command](argv)
