"""The run folder, owned here: the name of every file a command writes, each result CSV's columns, the
identity of a row, what state a run is in, and the one way rows are written.

A result row (results, per-position, per-article and probe CSVs) says which model it measured: the run
(``run_id``, made when training starts and kept in its checkpoints), its encoding and seed, the state of
the weights (``model_step``: the training step of the checkpoint; ``model_final``: whether training had
finished) and the evaluation's own keys (``MEASUREMENT_KEYS``). ``merge_rows`` is the only writer: rows of
other runs are never replaced, a run's rows with the same measurement keys are, and its rows measured on
another state of the weights are dropped. A run that finishes drops them from every file (``finalize``).

Rows written before these columns existed belong to the folder they are in (``legacy_run_id``) and to an
unknown state, which is never called stale. Every reader accepts ``NAME.csv.gz`` for ``NAME.csv``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pandas as pd
import yaml

from .errors import PosbenchError, Refused, RunFolderBusy, describe
from .io import write_csv, write_text

log = logging.getLogger(__name__)

RESULTS = "results.csv"
PER_POSITION = "per_position.csv"
PER_ARTICLE = "per_article.csv"
TRAIN_LOG = "train_log.csv"
CONTEXT_CSV = "context_usage.csv"
COPY_CSV = "copy_probe.csv"
ATTENTION_CSV = "attention_stats.csv"
BIAS_CSV = "bias_curves.csv"
#: ``posbench generate``: a row per prompt and window of generated positions, and the samples as text.
GENERATION = "generation.csv"
SAMPLES = "samples.jsonl"
#: A task run's accuracy at every (eval_len, distance) (tasks/measure.py).
TASK_RESULTS = "task_results.csv"
#: The best model by validation loss, and the state to continue training from (checkpoint.py).
CHECKPOINT = "checkpoint.pt"
RESUME_CHECKPOINT = "last.pt"
#: A run's one-line account of why it stopped (written by ``train``, read by ``report``).
ERROR_FILE = "error.txt"
#: Held (flock) by the process writing to a run folder; it holds that process's pid.
LOCK_FILE = ".lock"
#: Hydra's record of the command that made the folder.
HYDRA_DIR = ".hydra"
#: The config of every run with rows in the folder, one ``RUN_ID.yaml`` each (the report groups by it).
RUN_CONFIGS = Path(".posbench") / "runs"
#: ``report DIR`` writes DIR/REPORT_DIR alone, built beside it in BUILDING_PREFIX folders, marked as its own.
REPORT_DIR = "report"
BUILDING_PREFIX = f".{REPORT_DIR}."
REPORT_MARK = ".posbench-report"

#: Which model a row measured.
STATE_COLUMNS = ["run_id", "model_step", "model_final"]
#: Which run a row belongs to, within a folder that may hold rows of several.
RUN_KEYS = ["run_id", "encoding", "seed"]
#: What a row measured, within its run: rows with the same keys replace each other.
RESULT_KEYS = ["split", "eval_len", "eval_mode", "stride", "variant", "precision"]
#: A sample's: its evaluation-time variant, precision, sampling seed and options, and prompt.
SAMPLE_KEYS = ["variant", "precision", "seed", "temperature", "top_k", "top_p", "source", "prompt_id"]
MEASUREMENT_KEYS = {
    RESULTS: RESULT_KEYS,
    PER_POSITION: RESULT_KEYS,  # a measurement's rows are replaced whole (its buckets may change)
    PER_ARTICLE: RESULT_KEYS,  # likewise (its number of articles changes with eval.max_tokens)
    CONTEXT_CSV: ["variant", "split", "context", "subset"],
    COPY_CSV: ["variant", "distance"],
    ATTENTION_CSV: ["variant", "eval_len", "layer", "head"],
    BIAS_CSV: ["variant", "head", "distance"],
    GENERATION: [*SAMPLE_KEYS, "position"],
    TASK_RESULTS: ["variant", "task", "eval_len", "distance"],
}
#: The CSVs of measurements, in the order a run writes them.
RESULT_FILES = tuple(MEASUREMENT_KEYS)

RESULT_COLUMNS = [
    *("encoding", "variant", "train_len", "train_lengths", "eval_len", "split", "eval_mode", "stride"),
    *("tokens", "nll", "ppl", "ppl_beyond", "unigram_ppl", "status", "reason", "seed", "params"),
    *("encoding_params", "stopped_step", "best_step", "stop_reason", "run_dir", "precision"),
]  # then STATE_COLUMNS, as in every result CSV (``merge_rows`` adds them)
#: Columns that say which measurement a per-position or per-article row belongs to.
MEASUREMENT_COLUMNS = ["encoding", "variant", "train_len", "seed", "split", "eval_mode", "stride", "eval_len"]
PER_POSITION_COLUMNS = [*MEASUREMENT_COLUMNS, "position", "nll", "count", "precision"]
PER_ARTICLE_COLUMNS = [*MEASUREMENT_COLUMNS, "article", "tokens", "nll_sum", "precision"]
#: The first columns of every probe CSV.
PROBE_IDENTITY = ["encoding", "variant", "train_len", "seed"]


@dataclass(frozen=True)
class ModelState:
    """The weights a row measured: of which run, from which training step, and whether training had ended."""

    run_id: str
    step: int
    final: bool

    def columns(self) -> dict:
        return {"run_id": self.run_id, "model_step": self.step, "model_final": self.final}


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def legacy_run_id(folder: Path) -> str:
    """The run of rows and checkpoints saved before runs had ids: the one of the folder they are in."""
    return "dir-" + hashlib.sha1(str(Path(folder).resolve()).encode()).hexdigest()[:10]


def model_state(payload: dict, checkpoint: Path) -> ModelState:
    """The state of a loaded checkpoint.pt (``checkpoint``: its path). One saved before checkpoints said
    whether training had ended is final when no last.pt lies beside it."""
    folder = Path(checkpoint).parent
    final = payload.get("final", not (folder / RESUME_CHECKPOINT).exists())
    return ModelState(payload.get("run_id") or legacy_run_id(folder), int(payload.get("step", 0)), bool(final))


def find(folder: Path, name: str) -> Path | None:
    """``folder/name``, or ``folder/name.gz`` (an archive's compressed copy), or None."""
    for path in (Path(folder) / name, Path(folder) / f"{name}.gz"):
        if path.is_file():
            return path
    return None


def read_csv(path: Path) -> pd.DataFrame:
    """A result CSV (plain or gzipped) with its state columns: rows from before them get the run of their
    folder, an unknown step (``best_step`` for those training wrote) and ``model_final`` true."""
    table = pd.read_csv(path, dtype={"variant": "string", "run_id": "string"})
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


def save_run_config(folder: Path, run_id: str, config: dict) -> None:
    """Keep the config of a run whose rows go into ``folder``: the report tells runs apart by it."""
    write_text(yaml.safe_dump(config, sort_keys=True), Path(folder) / RUN_CONFIGS / f"{run_id}.yaml")


def run_configs(folder: Path) -> dict[str, dict]:
    """The configs of the runs with rows in ``folder``, by run id. A training folder from before run ids
    has its run's config in Hydra's record only (the run of ``legacy_run_id``)."""
    configs = {}
    hydra = Path(folder) / HYDRA_DIR
    with contextlib.suppress(OSError, yaml.YAMLError, TypeError, KeyError):
        if yaml.safe_load((hydra / "hydra.yaml").read_text())["hydra"]["job"]["name"] == "train":
            configs[legacy_run_id(folder)] = yaml.safe_load((hydra / "config.yaml").read_text())
    for path in sorted((Path(folder) / RUN_CONFIGS).glob("*.yaml")):
        with contextlib.suppress(OSError, yaml.YAMLError):
            configs[path.stem] = yaml.safe_load(path.read_text())
    return configs


def record_error(message: str, folder: Path) -> None:
    """The run's one-line account for ``report``; a folder that cannot take it (read-only, full) does without."""
    with contextlib.suppress(OSError):
        write_text(f"{message}\n", Path(folder) / ERROR_FILE)


@contextlib.contextmanager
def errors_recorded(folder: Path | None) -> Iterator[None]:
    """Training's account of why it stopped: any failure or signal goes to ``folder``'s error.txt, except a
    refusal, which leaves the folder as it was (None: this process does not write the folder)."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as e:
        if folder is not None and not isinstance(e, Refused):
            record_error(describe(e), folder)
        raise


def clear_error(folder: Path) -> None:
    """A run that starts again starts with a clean slate."""
    with contextlib.suppress(OSError):
        (Path(folder) / ERROR_FILE).unlink(missing_ok=True)


@contextlib.contextmanager
def lock_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process's writes; another process trying the same gets RunFolderBusy.

    The kernel drops the lock when the process exits, killed or not. Once it is held, no other
    posbench process writes here, so temporary files left by an interrupted write are removed.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise busy(run_dir, f.read().strip()) from None
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        remove_orphaned_temp_files(run_dir)
        yield


def check_free(run_dir: Path) -> None:
    """RunFolderBusy if another process holds ``run_dir``, found without taking or changing anything there."""
    if not (Path(run_dir) / LOCK_FILE).is_file():
        return
    with open(Path(run_dir) / LOCK_FILE) as f:  # read only: the lock file keeps its holder's pid
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(run_dir, f.read().strip()) from None


def busy(run_dir: Path, holder: str) -> RunFolderBusy:
    return RunFolderBusy(
        f"another posbench process (pid {holder or 'unknown'}) is writing to {run_dir}; "
        "wait for it to finish or use another folder"
    )


def remove_orphaned_temp_files(folder: Path) -> None:
    """Delete the ``.NAME.*.tmp`` files of ``atomic_write`` calls that a kill interrupted."""
    for tmp in Path(folder).glob(".*.*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)


def unfinished_reason(folder: Path) -> str:
    """Why a folder's run is not finished ("" when it is, or holds no training of its own)."""
    if (Path(folder) / RESUME_CHECKPOINT).is_file():
        return f"unfinished: training has not ended ({RESUME_CHECKPOINT} present; train.resume=auto continues it)"
    return ""
