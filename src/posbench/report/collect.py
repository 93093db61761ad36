"""Reading a folder of runs: every CSV of every run folder, read once, the rows that cannot be used left out."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import EVAL_MODES
from ..errors import PosbenchError
from ..evaluate import PER_ARTICLE, PER_POSITION, variant_parts
from ..io import ERROR_FILE
from ..probes.suite import ATTENTION_CSV, BIAS_CSV, CONTEXT_CSV, COPY_CSV

log = logging.getLogger(__name__)

REPORT_DIR = "report"
#: The name start of a report being built or replaced beside REPORT_DIR: never a run.
BUILDING_PREFIX = f".{REPORT_DIR}."
RESULTS = "results.csv"
TRAIN_LOG = "train_log.csv"

#: Files that make a folder a run folder: Hydra's record of the run, or what a run writes.
RUN_MARKERS = (".hydra", RESULTS, "last.pt", "checkpoint.pt", ERROR_FILE)
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
}


#: A run's own columns that tell two runs' lines apart; a file without them gets the run's (``Runs.rows``).
RUN_IDENTITY = ("precision", "train_lengths")


@dataclass(frozen=True)
class Run:
    """One run folder's CSVs by file name (results.csv always among them), each holding its usable rows."""

    folder: Path
    tables: dict[str, pd.DataFrame]

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
        return Run(run.folder, tables) if len(tables[RESULTS]) else None

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


def collect_runs(root: Path, selection: Selection = KEEP_ALL) -> Runs:
    """Every CSV of RUN_CSVS in the run folders below ``root`` (the report folder excluded), the rows that
    ``selection`` keeps; a run none of whose results it keeps is not reported."""
    read, left_out = [], {}
    for folder in run_folders(root):
        run, problems = read_run(folder)
        if run is not None:
            read.append(run)
        if problems:
            left_out[folder] = "; ".join(problems)
    for folder, reason in left_out.items():
        log.warning("leaving out %s: %s", folder, reason)
    if not read:
        example = next(iter(left_out.items()), None)
        left = f"; {len(left_out)} run folder(s) left out, e.g. {example[0]}: {example[1]}" if example else ""
        raise PosbenchError(f"no finished runs under {root} (no readable results.csv){left}")
    selection.check_found(read)
    reported = [kept for run in read if (kept := selection.apply(run)) is not None]
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


def is_report(name: str) -> bool:
    return name == REPORT_DIR or name.startswith(BUILDING_PREFIX)


def why_skipped(run: Path) -> str:
    """Why a run folder without a usable results.csv cannot be reported."""
    if (run / ERROR_FILE).is_file():
        lines = (run / ERROR_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
        return f"failed: {lines[0] if lines else 'no reason recorded'}"
    if (run / "last.pt").is_file():
        return "unfinished: no results.csv yet (train.resume=auto continues it)"
    return "incomplete: no results.csv (still running, or stopped before its first checkpoint)"


def read_run(folder: Path) -> tuple[Run | None, list[str]]:
    """The run in ``folder`` (None when its results.csv is missing or unusable) and what was left out, and why."""
    if not (folder / RESULTS).is_file():
        return None, [why_skipped(folder)]
    results, problem = read_table(folder / RESULTS)
    if results is None:
        return None, [problem]
    missing = [c for c in REQUIRED_COLUMNS if c not in results.columns]
    if missing:
        return None, [f"results.csv lacks {', '.join(missing)}"]
    if results.empty:
        return None, [problem or "results.csv has no rows"]
    tables, problems = {RESULTS: results}, [problem] if problem else []
    for name in RUN_CSVS:
        if name != RESULTS and (folder / name).is_file():
            table, problem = read_table(folder / name)
            if table is not None:
                tables[name] = table
            problems += [problem] if problem else []
    return Run(folder, tables), problems


def read_table(path: Path) -> tuple[pd.DataFrame | None, str]:
    """The usable rows of the CSV at ``path`` (None when it cannot be read) and what was left out, and why."""
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"unreadable {path.name}: {first_line}"
    faults = row_faults(table, RUN_CSVS[path.name])
    bad = faults != ""
    if not bad.any():
        return table, ""
    reasons = ", ".join(f"{count} {fault}" for fault, count in faults[bad].value_counts(sort=False).items())
    usable = table[~bad].reset_index(drop=True)
    for column in RUN_CSVS[path.name]:
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
