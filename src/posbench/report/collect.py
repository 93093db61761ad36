"""Reading a folder of runs: every CSV of every run folder, read once, the rows that cannot be used left out.

A report holds finished models only: a folder whose training has not ended, rows measured on weights
before training ended, a symbolic link (not followed) are listed as left out, each with its reason. A
folder may hold rows of several runs (``posbench eval`` of several runs into one folder): each is a ``Run``.
Runs of one line that differ in a config key that changes results (``CONFIG_IGNORED`` aside) are told
apart by a ``config`` label naming the keys; only seeds are averaged.

This module finds the run folders and splits them into runs; the rest it takes from, and re-exports:
``runs`` (``Run``, ``Runs``), ``selection`` (``Selection``), ``csvs`` (``RUN_CSVS``, ``read_table``: the
usable rows of one CSV) and ``config_label`` (``told_apart``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from ..errors import PosbenchError
from ..runfolder import (
    BUILDING_PREFIX,
    CHECKPOINT,
    ERROR_FILE,
    HYDRA_DIR,
    MEASUREMENT_KEYS,
    PER_ARTICLE,
    PER_POSITION,
    REPORT_DIR,
    RESULTS,
    RESUME_CHECKPOINT,
    RUN_KEYS,
    TASK_RESULTS,
    TRAIN_LOG,
    find,
    unfinished_reason,
)
from .config_label import CONFIG_IGNORED, result_changing, told_apart, trained_line
from .csvs import RUN_CSVS, read_table, row_faults
from .runs import RUN_IDENTITY, Run, Runs, lengths_text
from .selection import KEEP_ALL, Selection, variants_in

# fmt: off
__all__ = [
    "collect_runs", "collect_results", "run_folders", "symbolic_links", "is_report", "why_skipped", "read_runs",
    "measured_when_finished", "split_by_run", "deduplicated", "RUN_MARKERS", "REQUIRED_COLUMNS",
    # re-exported
    "Run", "Runs", "RUN_IDENTITY", "lengths_text", "Selection", "KEEP_ALL", "RUN_CSVS", "read_table", "row_faults",
    "CONFIG_IGNORED", "told_apart", "result_changing", "trained_line",
]
# fmt: on

log = logging.getLogger(__name__)

#: Files that make a folder a run folder: Hydra's record of the run, or what a run writes.
RUN_MARKERS = (HYDRA_DIR, RESULTS, f"{RESULTS}.gz", TASK_RESULTS, RESUME_CHECKPOINT, CHECKPOINT, ERROR_FILE)
#: Columns the report cannot do without.
REQUIRED_COLUMNS = ("encoding", "train_len", "eval_len", "split", "ppl", "status", "run_dir")


def collect_runs(
    root: Path, selection: Selection = KEEP_ALL, required: bool = True, found: frozenset[str] = frozenset()
) -> Runs:
    """Every CSV of RUN_CSVS in the run folders below ``root`` (the report folder excluded), the rows that
    ``selection`` keeps; a run none of whose results it keeps is not reported. Not ``required`` (a folder
    of task runs, which ``report.tasks`` reads): finding none is no error. ``found``: the variants of the
    rows read beside these (task, generation), which the selection may name too."""
    read, left_out = [], dict(symbolic_links(root))
    for folder in run_folders(root):
        runs, problems = read_runs(folder)
        read += runs
        if problems:
            left_out[folder] = "; ".join(problems)
    for folder, reason in left_out.items():
        log.warning("leaving out %s: %s", folder, reason)
    if not read and required:
        example = next(iter(left_out.items()), None)
        left = f"; {len(left_out)} run folder(s) left out, e.g. {example[0]}: {example[1]}" if example else ""
        raise PosbenchError(f"no finished runs under {root} (no readable results.csv){left}")
    selection.check_found(set(found).union(*(variants_in(run.tables[RESULTS]) for run in read)))
    if not read:
        return Runs([], left_out)
    reported = [kept for run in told_apart(read) if (kept := selection.apply(run)) is not None]
    if not reported:
        raise PosbenchError(f"no results under {root} that {selection} keeps")
    return Runs(reported, left_out)


def collect_results(root: Path) -> tuple[pd.DataFrame, dict[Path, str]]:
    """The usable results.csv rows below ``root``, concatenated, and what was left out of which run folder."""
    runs = collect_runs(root)
    return runs.rows(RESULTS), runs.left_out


def run_folders(root: Path) -> list[Path]:
    """Every folder below ``root`` holding one of RUN_MARKERS, outside the report and the report being built."""
    folders = {path.parent for marker in RUN_MARKERS for path in root.rglob(marker)}
    return sorted(f for f in folders if not any(is_report(part) for part in f.relative_to(root).parts))


def symbolic_links(root: Path) -> list[tuple[Path, str]]:
    """The links to folders below ``root``, which the report does not follow (a run would be counted twice, or
    a link could lead out of ``root``), with where they point."""
    links = []
    for folder, names, _ in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_symlink() and not is_report(name):
                links.append((path, f"a symbolic link to {os.readlink(path)}, not followed: report that folder"))
    return links


def is_report(name: str) -> bool:
    return name == REPORT_DIR or name.startswith(BUILDING_PREFIX)


def why_skipped(run: Path) -> str:
    """Why a run folder without a usable results.csv cannot be reported."""
    if (run / ERROR_FILE).is_file():
        lines = (run / ERROR_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
        return f"failed: {lines[0] if lines else 'no reason recorded'}"
    if (run / RESUME_CHECKPOINT).is_file():
        return "unfinished: no results yet (train.resume=auto continues it)"
    return "incomplete: no results.csv (still running, or stopped before its first checkpoint)"


def read_runs(folder: Path) -> tuple[list[Run], list[str]]:
    """The runs with rows in ``folder`` (none when its results.csv is missing or unusable, or its own training has
    not ended) and what was left out, and why."""
    if find(folder, RESULTS) is None:  # a task run has task_results.csv alone (report/tasks.py reads it)
        return [], [] if find(folder, TASK_RESULTS) else [why_skipped(folder)]
    if unfinished_reason(folder):
        return [], [unfinished_reason(folder)]
    results, problem = read_table(find(folder, RESULTS), RESULTS)
    if results is None:
        return [], [problem]
    missing = [c for c in REQUIRED_COLUMNS if c not in results.columns]
    if missing:
        return [], [f"results.csv lacks {', '.join(missing)}"]
    if results.empty:
        return [], [problem or "results.csv has no rows"]
    tables, problems = {RESULTS: results}, [problem] if problem else []
    for name in RUN_CSVS:
        path = find(folder, name)
        if name != RESULTS and path is not None:
            table, problem = read_table(path, name)
            if table is not None:
                tables[name] = table
            problems += [problem] if problem else []
    tables, unfinished = measured_when_finished(tables)
    return split_by_run(folder, tables), problems + unfinished


def measured_when_finished(tables: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The rows measured on a finished run's final weights, and what was left out: rows measured while their
    run was still training (``posbench eval`` or ``probe`` on an unfinished run)."""
    kept, problems = {}, []
    for name, table in tables.items():
        early = ~table["model_final"] if "model_final" in table else pd.Series(False, index=table.index)
        if early.any():
            steps = ", ".join(str(int(s)) for s in sorted(table.loc[early, "model_step"].dropna().unique()))
            problems.append(
                f"{name}: {int(early.sum())} rows measured before training ended (step {steps}): "
                "finish the run, then eval or probe it again"
            )
        kept[name] = table[~early].reset_index(drop=True)
    return kept, problems


def split_by_run(folder: Path, tables: dict[str, pd.DataFrame]) -> list[Run]:
    """One Run per run id in the folder's results; train_log.csv goes to the run trained here (the one whose
    rows say where training stopped)."""
    results = tables[RESULTS]
    stopped = results["stop_reason"].notna() if "stop_reason" in results else pd.Series(False, index=results.index)
    trained_here = set(results.loc[stopped, "run_id"])
    runs = []
    for run_id in results["run_id"].drop_duplicates():
        own = {
            name: deduplicated(table[table["run_id"] == run_id], name)
            for name, table in tables.items()
            if "run_id" in table
        }
        if TRAIN_LOG in tables and (run_id in trained_here or results["run_id"].nunique() == 1):
            own[TRAIN_LOG] = tables[TRAIN_LOG]
        if len(own[RESULTS]):
            runs.append(Run(folder, own, run_id))
    return runs


def deduplicated(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """A run's rows with one row per measurement (the last written), as merging keeps them."""
    if name not in MEASUREMENT_KEYS or name in (PER_POSITION, PER_ARTICLE):
        return table.reset_index(drop=True)
    keys = [c for c in [*RUN_KEYS, *MEASUREMENT_KEYS[name]] if c in table]
    return table[~table[keys].astype("string").duplicated(keep="last")].reset_index(drop=True)


def collect_finished_rows(root: Path, name: str) -> tuple[pd.DataFrame, dict[Path, str]]:
    """Every finished run's rows of the CSV ``name`` below ``root`` (one per measurement, with ``run_dir``; its
    ``variant`` as text), and what was left out of which folder: the CSVs a run folder may hold without a
    results.csv (task runs) or beside it (generation), read one file at a time."""
    frames, left_out = [], {}
    for folder in run_folders(root):
        path = find(folder, name)
        if path is None:
            continue
        if unfinished_reason(folder):
            left_out[folder] = unfinished_reason(folder)
            continue
        table, problem = read_table(path, name)
        tables, unfinished = measured_when_finished({name: table}) if table is not None else ({}, [])
        problems = [p for p in [problem, *unfinished] if p]
        if problems:
            left_out[folder] = "; ".join(problems)
        if tables and len(tables[name]):
            frames.append(deduplicated(tables[name], name).assign(run_dir=str(folder)))
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(rows):
        rows["variant"] = rows["variant"].astype("string").fillna("")
    return rows, left_out
