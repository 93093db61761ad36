"""The report's numbers: rows on one footing, means and stds over seeds, the Markdown of summary.md and the
curves the figures draw. Pure functions of what ``collect_runs`` returned."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..evaluate import variant_parts
from ..markdown import markdown_table
from .collect import RESULTS, TRAIN_LOG, Run, lengths_text

#: The group whose seeds are averaged: one line of a figure, one row of a table.
LINE = ["encoding", "variant", "train_len", "precision", "train_lengths", "config"]
POINT = [*LINE, "eval_mode", "split", "eval_len"]
#: A model whose perplexity at its training length is above this fraction of the unigram
#: reference has barely learned to use context.
CONTEXT_FREE = 0.8


def normalise(results: pd.DataFrame) -> pd.DataFrame:
    """Rows of every version of results.csv on one footing: columns it lacked get their meaning
    for a plain model (no variant, non-overlapping windows, stride = eval_len; precision unrecorded: "";
    trained at train_len alone)."""
    df = results.copy()
    defaults = dict(variant="", eval_mode="nonoverlapping", seed=0, ppl_beyond=float("nan"), unigram_ppl=float("nan"))
    defaults.update(precision="", config="")
    for column, default in defaults.items():
        if column not in df:
            df[column] = default
    for column in ("variant", "eval_mode", "precision", "config"):
        df[column] = df[column].astype("string").fillna(defaults[column]).astype(str)
    if "stride" not in df:
        df["stride"] = df["eval_len"]
    lengths = df["train_lengths"] if "train_lengths" in df else df["train_len"]
    df["train_lengths"] = lengths.fillna(df["train_len"]).map(lengths_text)
    return df


def natural_key(text: str) -> str:
    """``text`` with its numbers zero-padded, so ``linear×4`` sorts before ``linear×16``."""
    return re.sub(r"\d+", lambda m: m.group().zfill(12), text)


def line_key(key: tuple) -> tuple:
    """The order of (encoding, variant, train_len) lines in tables and legends."""
    return (key[0], natural_key(key[1]), *key[2:])


def by_line(df: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """``df`` grouped by line, in ``line_key`` order."""
    return sorted(df.groupby(LINE), key=lambda item: line_key(item[0]))


def label(
    encoding: str,
    variant: str,
    train_len: int | None = None,
    precision: str = "",
    train_lengths: str = "",
    config: str = "",
) -> str:
    name = " ".join(part for part in (encoding, variant, precision, f"[{config}]" if config else "") if part)
    if train_len is None:
        return name
    return f"{name} (train {train_lengths if train_lengths not in ('', str(train_len)) else train_len})"


def at_train_len_alone(df: pd.DataFrame) -> pd.Series:
    """Whether each row's run trained at its train_len alone (no ``train.lengths``): its train_lengths says
    nothing more, so lines and tables name train_lengths only where some run mixed lengths."""
    return df["train_lengths"] == df["train_len"].astype(str)


def unlabelled_single_precision(df: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its precision blanked when ``results`` hold one precision: a line names its precision
    only in a report that compares several, so single-precision reports read as before."""
    if "precision" not in df or results["precision"].nunique() > 1:
        return df
    return df.assign(precision="")


def splits(results: pd.DataFrame) -> list[str]:
    """The splits measured, the one the figures show first."""
    return [s for s in ("test", "valid") if s in set(results["split"])]


def eval_modes(df: pd.DataFrame) -> list[str]:
    """The eval modes in ``df``, non-overlapping windows first."""
    return sorted(set(df["eval_mode"]), key=lambda mode: (mode != "nonoverlapping", mode))


def aggregate(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample standard deviation (n - 1) across seeds of ppl and ppl_beyond at every point."""
    ok = results[results["status"] == "ok"]
    summary = (
        ok.groupby(POINT, dropna=False)
        .agg(
            seeds=("seed", "nunique"),
            ppl_mean=("ppl", "mean"),
            ppl_std=("ppl", "std"),
            ppl_beyond_mean=("ppl_beyond", "mean"),
            ppl_beyond_std=("ppl_beyond", "std"),
            unigram_ppl=("unigram_ppl", "mean"),
        )
        .reset_index()
    )
    unsupported = results[results["status"] != "ok"].groupby(POINT, dropna=False)["status"].first().reset_index()
    return pd.concat([summary, unsupported], ignore_index=True).sort_values(
        POINT, key=lambda column: column.map(natural_key) if column.name == "variant" else column, ignore_index=True
    )


def mean_std(mean: float, std: float) -> str:
    """'1,234.5 ± 6.7' (the mean alone where std is NaN: one seed), '' where nothing was measured."""
    if pd.isna(mean):
        return ""
    return f"{mean:,.1f}" if pd.isna(std) else f"{mean:,.1f} ± {std:.1f}"


def signed(value: float, digits: int, suffix: str = "") -> str:
    """+1.2% / −1.2% with a typographic minus (+0.0, not −0.0, for what rounds to zero)."""
    return f"{round(value, digits) + 0.0:+,.{digits}f}{suffix}".replace("-", "−")


def change(mean: float, base: float) -> str:
    """' (+4.2%)': the change of a mean perplexity against the one at train_len."""
    return f" ({signed(100 * (mean / base - 1), 1, '%')})"


def summary_table(summary: pd.DataFrame, split: str, mode: str, value: str = "ppl") -> pd.DataFrame:
    """(encoding, variant, train_len) x eval_len cells "mean ± std", or the status where nothing was measured.

    For ``ppl`` the change of the mean relative to the training length is added in brackets
    and the split's unigram perplexity is the last column.
    """
    df = summary[(summary["split"] == split) & (summary["eval_mode"] == mode)]
    rows = {}
    for key, group in by_line(df):
        group = group.set_index("eval_len")
        base = group["ppl_mean"].get(key[2]) if value == "ppl" else None
        cells = {}
        for eval_len, point in group.iterrows():
            mean, std = point[f"{value}_mean"], point[f"{value}_std"]
            cell = mean_std(mean, std) or (point["status"] if isinstance(point.get("status"), str) else "")
            if value == "ppl" and not pd.isna(mean) and not pd.isna(base) and eval_len != key[2]:
                cell += change(mean, base)
            cells[eval_len] = cell
        if value == "ppl":
            unigram = group["unigram_ppl"].mean()
            cells["unigram"] = "" if pd.isna(unigram) else f"{unigram:.1f}"  # runs older than the column
        rows[key] = cells
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.names = LINE
    for unnamed in ("precision", "config"):  # named only where some line has one
        if (table.index.get_level_values(unnamed) == "").all():
            table.index = table.index.droplevel(unnamed)
    if at_train_len_alone(table.index.to_frame()).all():
        table.index = table.index.droplevel("train_lengths")
    lengths = sorted(c for c in table.columns if c != "unigram")
    table = table[lengths + (["unigram"] if "unigram" in table.columns else [])].fillna("")
    return table.loc[:, (table != "").any()]


def to_markdown(table: pd.DataFrame) -> str:
    """A table of ``summary_table`` with its index (the line) as the first columns."""
    rows = ([*index, *row] for index, row in table.iterrows())
    return markdown_table([*table.index.names, *table.columns], rows)


def context_free_warnings(summary: pd.DataFrame, split: str) -> list[str]:
    """One line per model whose perplexity at its training length is close to the unigram reference."""
    df = summary[
        (summary["split"] == split)
        & (summary["eval_mode"] == "nonoverlapping")
        & (summary["eval_len"] == summary["train_len"])
    ]
    return [
        f"- **{label(*(getattr(p, column) for column in LINE))}**: {split} perplexity {p.ppl_mean:.1f} at the "
        f"training length is not clearly below the unigram reference {p.unigram_ppl:.1f} "
        f"(above {CONTEXT_FREE:.0%} of it): the model has barely learned to use context, so its extrapolation "
        "numbers mean little."
        for p in df.itertuples()
        if p.ppl_mean > CONTEXT_FREE * p.unigram_ppl
    ]


def mode_title(results: pd.DataFrame, mode: str) -> str:
    in_mode = results[(results["eval_mode"] == mode) & (results["stride"] < results["eval_len"])]
    strides = sorted(in_mode["stride"].unique())
    return f"{mode} (stride {', '.join(str(int(s)) for s in strides)})" if strides else mode


def summary_markdown(
    root: Path, results: pd.DataFrame, summary: pd.DataFrame, left_out: dict[Path, str], sections: list[str] = ()
) -> str:
    """summary.md: warnings, a ppl and a ppl_beyond table per split and eval mode, the further ``sections``
    (the paired comparison's, the probes'), the runs (or rows) left out."""
    parts = [
        f"# posbench report\n\n{results['run_id'].nunique()} runs under `{root}`. Cells: mean ± sample standard "
        "deviation over seeds (the `seeds` column of summary.csv says how many); in brackets the change of the "
        "mean relative to the training length; `unigram`: the perplexity of a model that ignores context "
        "(training-split frequencies)."
    ]
    warnings = context_free_warnings(summary, splits(results)[0])
    if warnings:
        parts.append("## Models that barely use context\n\n" + "\n".join(warnings))
    for split in splits(results):
        for mode in eval_modes(summary[summary["split"] == split]):
            ppl = to_markdown(summary_table(summary, split, mode))
            parts.append(f"## {split} perplexity, {mode_title(results, mode)}\n\n{ppl}")
            beyond = to_markdown(summary_table(summary, split, mode, value="ppl_beyond"))
            parts.append(
                f"### {split}, {mode}: perplexity of the tokens at window positions ≥ train_len only\n\n{beyond}"
            )
    parts += sections
    if left_out:
        parts.append("## Runs left out\n\n" + "\n".join(f"- `{run}`: {reason}" for run, reason in left_out.items()))
    return "\n\n".join(parts) + "\n"


def per_position_curves(
    per_position: pd.DataFrame, split: str, bins_per_octave: int = 4
) -> tuple[pd.DataFrame, int | None]:
    """Mean NLL per (line, position bin) at the longest length in non-overlapping mode, pooled over seeds.

    Positions are grouped in log-spaced bins (``bins_per_octave`` per doubling), weighting
    each position by its token count; ``x`` is the bin's mean number of tokens in context + 1.
    """
    if per_position.empty:
        return pd.DataFrame(), None
    df = normalise(per_position)
    df = df[(df["split"] == split) & (df["eval_mode"] == "nonoverlapping")]
    if df.empty:
        return pd.DataFrame(), None
    longest = int(df["eval_len"].max())
    df = df[df["eval_len"] == longest].copy()
    df["bin"] = (np.log2(df["position"] + 1) * bins_per_octave).round()
    df["weighted_nll"], df["weighted_x"] = df["nll"] * df["count"], (df["position"] + 1) * df["count"]
    sums = dict(weighted_nll=("weighted_nll", "sum"), weighted_x=("weighted_x", "sum"), count=("count", "sum"))
    curves = df.groupby([*LINE, "bin"]).agg(**sums).reset_index()
    curves["nll"], curves["x"] = curves["weighted_nll"] / curves["count"], curves["weighted_x"] / curves["count"]
    return curves[[*LINE, "x", "nll", "count"]], longest


def training_curves(runs: list[Run]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Validation loss by tokens seen: the mean per line over the seeds that reached those tokens, and each
    run's points where it stopped (``stopped``) and at its best step (``best``), as results.csv records them
    (runs from before stopped_step and best_step have none)."""
    frames = [frame for frame in map(run_curve, runs) if frame is not None]
    if not frames:
        return pd.DataFrame(), pd.DataFrame()
    points = pd.concat(frames, ignore_index=True)
    means = points.groupby([*LINE, "tokens"])["valid_loss"].mean().reset_index()
    return means, points[points["stopped"] | points["best"]]


def run_curve(run: Run) -> pd.DataFrame | None:
    """One run's validations (train_log.csv rows with a valid_loss), its line, and which are its stop and best."""
    train_log, results = run.tables.get(TRAIN_LOG), run.tables[RESULTS]
    if train_log is None or not {"step", "tokens", "valid_loss"} <= set(train_log.columns):
        return None
    valid = train_log.dropna(subset=["valid_loss"])
    return valid.assign(
        encoding=results["encoding"].iloc[0],
        variant=trained_variant(results),  # as trained: no evaluation-time variant
        train_len=results["train_len"].iloc[0],
        precision=run.precision,
        train_lengths=run.train_lengths,
        config=run.config,
        stopped=valid["step"] == recorded_step(results, "stopped_step"),
        best=valid["step"] == recorded_step(results, "best_step"),
    )


def trained_variant(results: pd.DataFrame) -> str:
    """The part of a run's variant that says how it was trained (``randpos8192``; "" for most runs), from its
    results.csv rows."""
    variants = results["variant"].astype("string").fillna("") if "variant" in results else pd.Series([""])
    return variant_parts(str(variants.iloc[0]))[0]


def recorded_step(results: pd.DataFrame, column: str) -> float:
    """A run's ``column`` (stopped_step, best_step) in its results.csv; NaN, which no step equals, where the
    rows do not say (runs from before the column, rows that ``posbench eval`` added)."""
    values = results[column].dropna() if column in results else ()
    return values.iloc[0] if len(values) else float("nan")
