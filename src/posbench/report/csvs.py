"""The CSVs a report reads from a run folder (``RUN_CSVS``) and the usable rows of each: a row with a value
that is not a number where one is due, or a measured perplexity that is not finite, is left out, and why is said."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..runfolder import (
    ATTENTION_CSV,
    BIAS_CSV,
    CONTEXT_CSV,
    COPY_CSV,
    GENERATION,
    MEASUREMENT_KEYS,
    PER_ARTICLE,
    PER_POSITION,
    RESULTS,
    TASK_RESULTS,
    TRAIN_LOG,
    read_csv,
)

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
