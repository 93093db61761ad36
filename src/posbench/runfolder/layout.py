"""What a run folder holds: the name of every file a command writes, each result CSV's columns, the keys
that identify a row, and the state of the weights a row measured (``ModelState``)."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

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
    COPY_CSV: ["variant", "distance", "vocab"],  # vocab: the words spans drew from (empty: every word)
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


def require(folder: Path, name: str) -> Path:
    """``find``, or FileNotFoundError naming the folder and the file it lacks."""
    path = find(folder, name)
    if path is None:
        raise FileNotFoundError(f"{folder}: no {name} (nor {name}.gz)")
    return path
