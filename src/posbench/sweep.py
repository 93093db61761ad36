"""Sweeps (``-m``) that finish: a failed job is recorded and the sweep goes on; a summary at the end.

Every job appends one line to ``SWEEP_LOG`` in the sweep folder (``finished DIR`` or ``failed DIR:
why``), whatever launcher ran it (in-process, joblib workers, submitit). ``SweepSummary``, a Hydra
callback in the main process, marks where a launch starts in that log and, at the end, prints
how many jobs finished and failed, each failure with its one line. Re-launching the same command
retries the failed jobs: a finished run is skipped by ``train.resume=auto``.

Job folders are named by their overrides (Hydra's ``override_dirname``); ``data.path`` is left out
of that (a path has slashes) and added back by ``data_tag`` as its last folder name and a short
hash, so that two jobs on different data never share a folder.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from .errors import Interrupted, describe

#: The sweep folder's record of its jobs' outcomes, one line each.
SWEEP_LOG = "sweep.log"
LAUNCH_MARK = "== launch "


def data_tag(path: str | None) -> str:
    """``,data.path=NAME-HASH`` for a job folder's name; empty without ``data.path``."""
    if not path:
        return ""
    resolved = str(Path(path).expanduser().resolve())
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(resolved).name)[:40]
    return f",data.path={name}-{hashlib.sha1(resolved.encode()).hexdigest()[:8]}"


OmegaConf.register_new_resolver("posbench_data_tag", data_tag, replace=True)
OmegaConf.register_new_resolver("posbench_absolute", lambda path: str(Path(path).expanduser().resolve()), replace=True)


def checkpoint_sweep_args(config_name: str, overrides: list[str]) -> list[str]:
    """``-m eval checkpoint=A,B`` (or probe): each job writes into its own run's folder, as a single ``eval``
    does, and the sweep's log goes to a folder of its own (the sweep folder cannot be one run's folder)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    swept = any(o.key_or_group == "checkpoint" and o.is_sweep_override() for o in parsed)
    if not swept or any(o.key_or_group.startswith("hydra.sweep.") for o in parsed):
        return []
    return [
        f"hydra.sweep.dir=outputs/multirun/{config_name}/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}",
        "hydra.sweep.subdir='${posbench_absolute:${posbench_run_dir:${checkpoint}}}'",  # absolute: the run's folder
    ]


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Every job's override list of a basic-sweeper multirun."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None) for job in batch]


def append_line(sweep_dir: Path, line: str) -> None:
    """One ``write`` in append mode: lines of jobs running side by side do not interleave."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / SWEEP_LOG, "a", encoding="utf-8") as f:
        f.write(line.replace("\n", " ") + "\n")


class SweepStopped(BaseException):
    """Ctrl-C or a signal in a job of an in-process sweep: not an ``Exception``, so that Hydra, which records
    a job's exception and launches the next job, lets it through and the whole sweep stops."""

    def __init__(self, message: str, sweep_dir: Path):
        super().__init__(message)
        self.message, self.sweep_dir = message, sweep_dir


def run_job(task, cfg, run_dir: Path, sweep_dir: Path) -> None:
    """One job of a sweep: a failure goes to the sweep log and one line (training also keeps it in the run's
    error.txt), and the sweep goes on; Ctrl-C or a signal stops the whole sweep (``SweepStopped``), and
    ``debug=true`` stops it with the traceback."""
    try:
        task(cfg, run_dir)
    except (Exception, KeyboardInterrupt) as e:
        message = describe(e)
        record_job(sweep_dir, run_dir, message)
        if cfg.get("debug", False):
            raise
        if isinstance(e, (KeyboardInterrupt, Interrupted)):
            raise SweepStopped(message, sweep_dir) from None
        print(f"posbench: job {run_dir} failed: {message}", file=sys.stderr)
        return
    record_job(sweep_dir, run_dir, None)


def record_job(sweep_dir: Path, run_dir: Path, error: str | None) -> None:
    run_dir, sweep_dir = run_dir.resolve(), sweep_dir.resolve()  # Hydra makes one absolute, not the other
    job = run_dir.relative_to(sweep_dir) if run_dir.is_relative_to(sweep_dir) else run_dir
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    append_line(sweep_dir, f"{stamp} failed {job}: {error}" if error else f"{stamp} finished {job}")


def outcomes(sweep_dir: Path) -> tuple[int, list[str]]:
    """(jobs finished, lines of jobs failed) since the last launch mark of the sweep log."""
    path = sweep_dir / SWEEP_LOG
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    marks = [i for i, line in enumerate(lines) if line.startswith(LAUNCH_MARK)]
    launch = lines[marks[-1] + 1 :] if marks else lines
    finished = sum(1 for line in launch if line.split(" ", 3)[2:3] == ["finished"])
    failed = [line.split(" ", 3)[3] for line in launch if line.split(" ", 3)[2:3] == ["failed"]]
    return finished, failed


class SweepSummary(Callback):
    """Marks a launch's start in the sweep log; prints the summary at its end (sets ``failures``)."""

    #: Failed jobs of the last multirun in this process (read by the CLI for its exit code).
    failures = 0

    def on_multirun_start(self, config, **kwargs) -> None:
        append_line(Path(config.hydra.sweep.dir), f"{LAUNCH_MARK}{time.strftime('%Y-%m-%d %H:%M:%S')}")

    def on_multirun_end(self, config, **kwargs) -> None:
        SweepSummary.failures = summarize(Path(config.hydra.sweep.dir), list(config.hydra.overrides.task))


def summarize(sweep_dir: Path, task_overrides: list[str], stopped: bool = False) -> int:
    """Print how many jobs of the launch finished and failed (each failure with its line); returns the
    number that failed or never reported. ``stopped``: a signal stopped the sweep, so those never started."""
    finished, failed = outcomes(sweep_dir)
    silent = len(expand_sweep(task_overrides)) - finished - len(failed)
    lines = [f"sweep {sweep_dir}: {finished} finished, {len(failed)} failed"]
    lines += [f"  failed {line}" for line in failed]
    if silent > 0:
        why = "not started: the sweep was stopped" if stopped else "did not report (killed?); see their folders"
        lines.append(f"  {silent} job(s) {why}")
    if failed or silent > 0:
        lines.append("  fix the cause and run the same command again: finished jobs are skipped")
    print("\n".join(lines), file=sys.stderr)
    return len(failed) + max(silent, 0)
