"""Reading and writing a run folder's result rows: ``merge_rows`` is the only writer.

A result row (results, per-position, per-article and probe CSVs) says which model it measured: the run
(``run_id``, made when training starts and kept in its checkpoints), its encoding and seed, the state of
the weights (``model_step``: the training step of the checkpoint; ``model_final``: whether training had
finished) and the evaluation's own keys (``MEASUREMENT_KEYS``). Rows of other runs are never replaced, a
run's rows with the same measurement keys are, and its rows measured on another state of the weights are
dropped. A run that finishes drops them from every file (``finalize``).

Rows written before these columns existed belong to the folder they are in (``legacy_run_id``) and to an
unknown state, which is never called stale. Every reader accepts ``NAME.csv.gz`` for ``NAME.csv``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from ..errors import PosbenchError
from ..io import write_csv, write_text
from .layout import (
    MEASUREMENT_KEYS,
    PER_ARTICLE,
    PER_POSITION,
    RESULT_FILES,
    RUN_KEYS,
    SAMPLE_KEYS,
    SAMPLES,
    ModelState,
    find,
    legacy_run_id,
)

log = logging.getLogger(__package__)  # posbench.runfolder, the name its log lines carry


def read_csv(path: Path) -> pd.DataFrame:
    """A result CSV (plain or gzipped) with its state columns: rows from before them get the run of their
    folder, an unknown step (``best_step`` for those training wrote) and ``model_final`` true."""
    # vocab (copy_probe.csv) is a key: 128 must read back as 128, not 128.0, beside empty cells
    table = pd.read_csv(path, dtype={"variant": "string", "run_id": "string", "vocab": "Int64"})
    if "run_id" not in table:
        table["run_id"] = legacy_run_id(Path(path).parent)
    if "model_step" not in table:
        table["model_step"] = table["best_step"] if "best_step" in table else float("nan")
    if "model_final" not in table:
        table["model_final"] = True
    table["run_id"] = table["run_id"].fillna(legacy_run_id(Path(path).parent))
    table["model_final"] = table["model_final"].map(lambda v: str(v).lower() in ("true", "1", "1.0"))
    return table


def read_mergeable(path: Path, name: str) -> pd.DataFrame:
    """The rows at ``path`` that new rows are merged into; a file they cannot go into is one line."""
    try:
        old = read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, EOFError, OSError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    else:
        missing = [
            k for k in MEASUREMENT_KEYS[name][:2] if k not in old.columns
        ]  # keys added later (precision) may be absent
        if not missing:
            return old
        reason = f"no {', '.join(missing)} column"
    raise PosbenchError(f"{path} is not a results file posbench can add rows to ({reason}); move it aside, run again")


def check_mergeable(folder: Path) -> None:
    """Before anything is measured: every result file in ``folder`` takes new rows (none is half-merged later)."""
    for name in RESULT_FILES:
        path = find(folder, name)
        if path is not None:
            read_mergeable(path, name)


def measured_rows(folder: Path, name: str, state: ModelState) -> pd.DataFrame:
    """The rows of ``name`` in ``folder`` measured on ``state``'s weights once training had ended (empty if none,
    or if ``state`` is not final): what an earlier, interrupted attempt to finish the same run wrote. Resuming
    refuses another config, so they are the numbers this attempt would measure again."""
    path = find(folder, name)
    if path is None or not state.final:
        return pd.DataFrame()
    table = read_mergeable(path, name)
    step = pd.to_numeric(table["model_step"], errors="coerce")
    return table[(table["run_id"] == state.run_id) & (step == state.step) & table["model_final"]].reset_index(drop=True)


def earlier_measurement(kept: pd.DataFrame, row: dict, name: str) -> dict | None:
    """The row of ``kept`` (``measured_rows`` of ``name``) that measured what ``row`` measures, or None."""
    if kept.empty:
        return None
    keys = MEASUREMENT_KEYS[name]
    same = _keys(kept, keys) == _keys(pd.DataFrame([row]), keys).iloc[0]
    return kept[same].iloc[-1].to_dict() if same.any() else None


def _keys(table: pd.DataFrame, columns: list[str]) -> pd.Series:
    return table.reindex(columns=columns).astype("string").fillna("").agg("|".join, axis=1)


def _stale(table: pd.DataFrame, state: ModelState) -> pd.Series:
    """Rows of ``state``'s run measured on other weights (rows of an unknown state are not called stale)."""
    step = pd.to_numeric(table["model_step"], errors="coerce")
    return (table["run_id"] == state.run_id) & step.notna() & (step != state.step)


def merge_rows(folder: Path, name: str, new: pd.DataFrame, state: ModelState) -> pd.DataFrame:
    """Write ``new`` (rows of ``state``'s model) into ``folder/name``, keeping every row of other runs and of
    this run's other measurements, dropping this run's rows measured on other weights; returns the file's rows."""
    new = new.assign(**state.columns())
    identity = identity_of(name)
    if name not in (PER_POSITION, PER_ARTICLE):  # those hold many rows per measurement
        new = new[~_keys(new, identity).duplicated(keep="last")]
    path = find(folder, name) or Path(folder) / name
    if path.is_file():
        old = read_mergeable(path, name)
        replaced = _keys(old, identity).isin(set(_keys(new, identity))) | _stale(old, state)
        new = pd.concat([old[~replaced], new], ignore_index=True)
    write_csv(new, path)
    return new


def identity_of(name: str) -> list[str]:
    """The columns that identify a row of ``name``: its run's and its measurement's."""
    return [*RUN_KEYS, *(k for k in MEASUREMENT_KEYS[name] if k not in RUN_KEYS)]


def merge_records(folder: Path, records: list[dict], state: ModelState) -> None:
    """``merge_rows`` for samples.jsonl, one JSON object a line: a record of this run with the same
    ``SAMPLE_KEYS`` is replaced, one of its records on other weights dropped, every other kept."""
    path = Path(folder) / SAMPLES
    records = [{**r, **state.columns()} for r in records]
    identity = [*RUN_KEYS, *SAMPLE_KEYS]

    def key(record: dict) -> tuple:
        return tuple(str(record.get(k)) for k in identity)

    def stale(record: dict) -> bool:
        return record.get("run_id") == state.run_id and record.get("model_step") not in (None, state.step)

    new = {key(r) for r in records}
    old = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    kept = [r for r in old if key(r) not in new and not stale(r)]
    write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept + records), path)


def finalize(folder: Path, state: ModelState) -> None:
    """A run has finished with the weights of ``state``: in every result file of its folder, its rows measured
    on other weights go, and those measured on these weights before the end are marked final."""
    for name in RESULT_FILES:
        path = find(folder, name)
        if path is None:
            continue
        table = read_mergeable(path, name)
        stale = _stale(table, state)
        same = (table["run_id"] == state.run_id) & (pd.to_numeric(table["model_step"], errors="coerce") == state.step)
        if stale.any():
            log.info("%s: %d rows measured on an earlier model of this run removed", path, int(stale.sum()))
        if stale.any() or not table.loc[same, "model_final"].all():
            table.loc[same, "model_final"] = True
            write_csv(table[~stale].reset_index(drop=True), path)
