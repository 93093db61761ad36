"""Reading a folder of runs: every CSV of every run folder, read once, the rows that cannot be used left out.

A report holds finished models only: a folder whose training has not ended, rows measured on weights
before training ended, a symbolic link (not followed) are listed as left out, each with its reason. A
folder may hold rows of several runs (``posbench eval`` of several runs into one folder): each is a ``Run``.
Runs of one line that differ in a config key that changes results (``CONFIG_IGNORED`` aside) are told
apart by a ``config`` label naming the keys; only seeds are averaged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import EVAL_MODES
from ..errors import PosbenchError
from ..evaluate import variant_parts
from ..resume import flatten
from ..runfolder import (
    ATTENTION_CSV,
    BIAS_CSV,
    BUILDING_PREFIX,
    CHECKPOINT,
    CONTEXT_CSV,
    COPY_CSV,
    ERROR_FILE,
    GENERATION,
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
    read_csv,
    run_configs,
    unfinished_reason,
)

log = logging.getLogger(__name__)

#: Files that make a folder a run folder: Hydra's record of the run, or what a run writes.
RUN_MARKERS = (HYDRA_DIR, RESULTS, f"{RESULTS}.gz", TASK_RESULTS, RESUME_CHECKPOINT, CHECKPOINT, ERROR_FILE)
#: Config keys that change no number of a run, or that a line already names (its seeds are averaged).
CONFIG_IGNORED = (
    *("seed", "debug", "device", "threads", "logger", "precision", "probes", "probe", "eval", "train.resume"),
    *("train.checkpoint_every", "encoding.name", "train_len", "train.lengths", "train.length_order"),
    "encoding.randomized_positions",
)
#: Columns the report cannot do without.
REQUIRED_COLUMNS = ("encoding", "train_len", "eval_len", "split", "ppl", "status", "run_dir")
#: The CSVs read from each run folder, with the columns whose values must be numbers. A run folder
#: without a usable results.csv is left out whole; its other CSVs are optional.
RUN_CSVS = {
    RESULTS: (
        "train_len",
        "eval_len",
        "stride",
        "tokens",
        "nll",
        "ppl",
        "ppl_beyond",
        "unigram_ppl",
        "seed",
        "params",
        "encoding_params",
        "stopped_step",
        "best_step",
    ),
    PER_POSITION: ("train_len", "seed", "stride", "eval_len", "position", "nll", "count"),
    PER_ARTICLE: ("train_len", "seed", "stride", "eval_len", "article", "tokens", "nll_sum"),
    TRAIN_LOG: ("tokens", "valid_loss"),
    CONTEXT_CSV: ("train_len", "seed", "context", "targets", "nll", "nll_se", "ppl"),
    COPY_CSV: ("train_len", "seed", "distance", "trials", "nll_copy", "nll_baseline", "gain", "accuracy"),
    ATTENTION_CSV: ("train_len", "seed", "eval_len", "layer", "head", "entropy", "mean_distance"),
    BIAS_CSV: ("train_len", "seed", "head", "distance", "bias"),
    GENERATION: ("train_len", "seed", "temperature", "top_k", "top_p", "position", "tokens", "repetition", "nll"),
    TASK_RESULTS: (
        *("train_len", "seed", "eval_len", "distance", "trials", "accuracy", "token_accuracy", "nll"),
        *("valid_accuracy", "learned_step", "best_step", "stopped_step"),
    ),
}


#: A run's own columns that tell two runs' lines apart; a file without them gets the run's (``Runs.rows``).
RUN_IDENTITY = ("precision", "train_lengths", "config")


@dataclass(frozen=True)
class Run:
    """One run's rows in one folder, by file name (results.csv always among them), each holding its usable rows;
    ``config``: the config keys that set it apart from the other runs of its line ("" for most)."""

    folder: Path
    tables: dict[str, pd.DataFrame]
    run_id: str = ""
    config: str = ""

    @property
    def precision(self) -> str:
        """The precision the run was evaluated in ("" where results.csv does not say, or says several)."""
        values = self.tables[RESULTS].get("precision", pd.Series(dtype=object)).dropna().unique()
        return str(values[0]) if len(values) == 1 else ""

    @property
    def train_lengths(self) -> str:
        """The lengths the run trained at, ``64|128|256`` (its train_len where results.csv does not say)."""
        results = self.tables[RESULTS]
        said = results.get("train_lengths", pd.Series(dtype=object)).dropna()
        return lengths_text(said.iloc[0] if len(said) else results["train_len"].iloc[0])


def lengths_text(value) -> str:
    """A ``train_lengths`` value as written: one length that CSV reading made a number (256.0) is ``256``."""
    return str(int(value)) if isinstance(value, (int, float, np.number)) else str(value)


@dataclass(frozen=True)
class Runs:
    """What ``collect_runs`` found: the runs it reports and, per run folder, what it left out and why."""

    reported: list[Run]
    left_out: dict[Path, str]

    def rows(self, name: str) -> pd.DataFrame:
        """The rows of every reported run's ``name`` CSV, in run order (no columns where no run has one)."""
        frames = [  # probe and per-position files: the run's precision and training lengths
            table.assign(**{column: getattr(run, column) for column in RUN_IDENTITY if column not in table})
            for run in self.reported
            if name in run.tables
            for table in [run.tables[name]]
        ]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass(frozen=True)
class Selection:
    """Which evaluations a report keeps (``report DIR variants=... modes=...``); None keeps every one.

    ``variants``: the evaluation-time variants kept beside the models as trained (``window256``; a
    variant's training part, ``randpos8192``, is how a model was trained and always kept). ``modes``:
    the eval modes kept (``nonoverlapping``, ``sliding``).
    """

    variants: tuple[str, ...] | None = None
    modes: tuple[str, ...] | None = None

    def __post_init__(self):
        unknown = sorted(set(self.modes or ()) - set(EVAL_MODES))
        if unknown:
            raise PosbenchError(f"modes={','.join(unknown)}: no such eval mode; the modes are {', '.join(EVAL_MODES)}")

    def __str__(self) -> str:
        chosen = (("variants", self.variants), ("modes", self.modes))
        return " ".join(f"{key}={','.join(value)}" for key, value in chosen if value is not None)

    def keep(self, table: pd.DataFrame) -> pd.Series:
        """The rows of a run's CSV that this selection keeps (every row of a table without the columns)."""
        kept = pd.Series(True, index=table.index)
        if self.variants is not None and "variant" in table:
            at_evaluation = table["variant"].astype("string").fillna("").map(lambda v: variant_parts(v)[1])
            kept &= (at_evaluation == "") | at_evaluation.isin(self.variants)
        if self.modes is not None and "eval_mode" in table:
            kept &= table["eval_mode"].isin(self.modes)
        return kept

    def apply(self, run: Run) -> Run | None:
        """``run`` with the rows this selection keeps; None where none of its results.csv rows is kept."""
        tables = {name: table[self.keep(table)].reset_index(drop=True) for name, table in run.tables.items()}
        return replace(run, tables=tables) if len(tables[RESULTS]) else None

    def check_found(self, runs: list[Run]) -> None:
        """Every variant named was measured somewhere: a misspelt one fails instead of leaving an empty line."""
        variants = (run.tables[RESULTS].get("variant", pd.Series(dtype=object)).dropna() for run in runs)
        found = {variant_parts(str(v))[1] for column in variants for v in column}
        missing = sorted(set(self.variants or ()) - found)
        if missing:
            there = ", ".join(sorted(found - {""})) or "none"
            raise PosbenchError(f"variants={','.join(missing)}: no run has it; the runs' variants: {there}")


#: The selection of a report without ``variants=`` or ``modes=``: every evaluation.
KEEP_ALL = Selection()


def collect_runs(root: Path, selection: Selection = KEEP_ALL, required: bool = True) -> Runs:
    """Every CSV of RUN_CSVS in the run folders below ``root`` (the report folder excluded), the rows that
    ``selection`` keeps; a run none of whose results it keeps is not reported. Not ``required`` (a folder
    of task runs, which ``report.tasks`` reads): finding none is no error."""
    read, left_out = [], dict(symbolic_links(root))
    for folder in run_folders(root):
        runs, problems = read_runs(folder)
        read += runs
        if problems:
            left_out[folder] = "; ".join(problems)
    for folder, reason in left_out.items():
        log.warning("leaving out %s: %s", folder, reason)
    if not read and not required:
        return Runs([], left_out)
    if not read:
        example = next(iter(left_out.items()), None)
        left = f"; {len(left_out)} run folder(s) left out, e.g. {example[0]}: {example[1]}" if example else ""
        raise PosbenchError(f"no finished runs under {root} (no readable results.csv){left}")
    selection.check_found(read)
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


def told_apart(runs: list[Run]) -> list[Run]:
    """``runs`` with their ``config`` label: the keys in which a run's config differs from the others of its
    line (seeds aside); "" where they agree, or a config is not known."""
    configs, by_folder = {}, {}
    for run in runs:
        if run.folder not in by_folder:  # a folder may hold several runs: its configs are read once
            by_folder[run.folder] = run_configs(run.folder)
        saved = by_folder[run.folder].get(run.run_id)
        configs[id(run)] = result_changing(saved) if isinstance(saved, dict) else None
    lines: dict[tuple, list[Run]] = {}
    for run in runs:
        lines.setdefault(trained_line(run), []).append(run)
    labelled = {}
    for members in lines.values():
        known = [configs[id(run)] for run in members if configs[id(run)] is not None]
        differing = sorted(k for k in set().union(*known) if len({str(c.get(k)) for c in known}) > 1) if known else []
        for run in members:
            config = configs[id(run)]
            text = ",".join(f"{k}={config.get(k)}" for k in differing) if config is not None else ""
            labelled[id(run)] = replace(run, config=text)
    return [labelled[id(run)] for run in runs]


def result_changing(config: dict) -> dict:
    """A run's config flattened, without the keys of CONFIG_IGNORED."""
    flat = flatten(config)
    return {k: v for k, v in flat.items() if not any(k == i or k.startswith(f"{i}.") for i in CONFIG_IGNORED)}


def trained_line(run: Run) -> tuple:
    """What a line names of how a run was trained: its encoding, training variant, train_len, precision, lengths."""
    first = run.tables[RESULTS].iloc[0]
    trained = variant_parts(str(first.get("variant", "") if pd.notna(first.get("variant", "")) else ""))[0]
    return (first["encoding"], trained, first["train_len"], run.precision, run.train_lengths)


def read_table(path: Path, name: str) -> tuple[pd.DataFrame | None, str]:
    """The usable rows of the CSV ``name`` at ``path`` (None when it cannot be read) and what was left out, and why."""
    try:
        table = read_csv(path) if name in MEASUREMENT_KEYS else pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, EOFError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"unreadable {path.name}: {first_line}"
    faults = row_faults(table, RUN_CSVS[name])
    bad = faults != ""
    if not bad.any():
        return table, ""
    reasons = ", ".join(f"{count} {fault}" for fault, count in faults[bad].value_counts(sort=False).items())
    usable = table[~bad].reset_index(drop=True)
    for column in RUN_CSVS[name]:
        if column in usable and not pd.api.types.is_numeric_dtype(usable[column]):
            usable[column] = pd.to_numeric(usable[column])  # the text column of numbers its faults made
    return usable, f"{path.name}: {bad.sum()} of {len(table)} rows left out ({reasons})"


def row_faults(table: pd.DataFrame, numeric: tuple[str, ...]) -> pd.Series:
    """Why each row cannot be used, "" where it can: a value that is not a number in one of the ``numeric``
    columns or, in results.csv, a measured (status ok) perplexity that is NaN or infinite."""
    faults = pd.Series("", index=table.index)
    for column in (c for c in numeric if c in table):
        parsed = pd.to_numeric(table[column], errors="coerce")
        faults[(faults == "") & parsed.isna() & table[column].notna()] = f"unparsable {column}"
    if {"ppl", "status"} <= set(table.columns):
        ppl = pd.to_numeric(table["ppl"], errors="coerce")
        faults[(faults == "") & (table["status"] == "ok") & ~np.isfinite(ppl)] = "non-finite ppl"
    return faults
