"""``posbench report DIR``: tables and figures from the results.csv files of every run below DIR.

Reads CSVs only, never trains. Writes DIR/report/: results.csv (every row), summary.csv
(mean and std over seeds), summary.md, and ppl_vs_length, per_position_loss and
training_curves as PNG and SVG.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .errors import PosbenchError  # noqa: E402
from .evaluate import PER_POSITION  # noqa: E402
from .io import ERROR_FILE, atomic_write, write_csv, write_text  # noqa: E402
from .positional import ENCODINGS  # noqa: E402

log = logging.getLogger(__name__)

REPORT_DIR = "report"


#: Files that make a folder a run folder: Hydra's record of the run, or what a run writes.
RUN_MARKERS = (".hydra", "results.csv", "last.pt", "checkpoint.pt", ERROR_FILE)
#: Columns the report cannot do without.
REQUIRED_COLUMNS = ("encoding", "train_len", "eval_len", "split", "ppl", "status", "run_dir")


def why_skipped(run: Path) -> str:
    """Why a run folder without a usable results.csv cannot be reported."""
    if (run / ERROR_FILE).is_file():
        lines = (run / ERROR_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
        return f"failed: {lines[0] if lines else 'no reason recorded'}"
    if (run / "last.pt").is_file():
        return "unfinished: no results.csv yet (train.resume=auto continues it)"
    return "incomplete: no results.csv (still running, or stopped before its first checkpoint)"


def collect_results(root: Path) -> tuple[pd.DataFrame, dict[Path, str]]:
    """Every finished run's results.csv below ``root`` (the report folder excluded), concatenated,
    and the run folders left out, each with the reason (failed, unfinished, unreadable)."""
    runs = sorted({p.parent for marker in RUN_MARKERS for p in root.rglob(marker)})
    frames, skipped = [], {}
    for run in runs:
        if REPORT_DIR in run.relative_to(root).parts:
            continue
        path = run / "results.csv"
        if not path.is_file():
            skipped[run] = why_skipped(run)
            continue
        try:
            frame = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
            skipped[run] = f"unreadable results.csv: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
            continue
        missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
        if missing or frame.empty:
            skipped[run] = f"results.csv lacks {', '.join(missing)}" if missing else "results.csv has no rows"
            continue
        frames.append(frame)
    for run, reason in skipped.items():
        log.warning("skipping %s: %s", run, reason)
    if not frames:
        left_out = f"; {len(skipped)} run folder(s) left out, e.g. {next(iter(skipped))}: {next(iter(skipped.values()))}" if skipped else ""
        raise PosbenchError(f"no finished runs under {root} (no readable results.csv){left_out}")
    return pd.concat(frames, ignore_index=True), skipped


#: The group whose seeds are averaged: one line of a figure, one row of a table.
LINE = ["encoding", "variant", "train_len"]
POINT = [*LINE, "eval_mode", "split", "eval_len"]
#: A model whose perplexity at its training length is above this fraction of the unigram
#: reference has barely learned to use context.
CONTEXT_FREE = 0.8


def normalise(results: pd.DataFrame) -> pd.DataFrame:
    """Rows of every version of results.csv on one footing: columns it lacked get their meaning
    for a plain model (no variant, non-overlapping windows, stride = eval_len)."""
    df = results.copy()
    defaults = {"variant": "", "eval_mode": "nonoverlapping", "seed": 0, "ppl_beyond": float("nan"), "unigram_ppl": float("nan")}
    for column, default in defaults.items():
        if column not in df:
            df[column] = default
    for column in ("variant", "eval_mode"):
        df[column] = df[column].astype("string").fillna(defaults[column]).astype(str)
    if "stride" not in df:
        df["stride"] = df["eval_len"]
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


def label(encoding: str, variant: str, train_len: int | None = None) -> str:
    name = f"{encoding} {variant}".strip()
    return name if train_len is None else f"{name} (train {train_len})"


def aggregate(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample standard deviation (n - 1) across seeds of ppl and ppl_beyond at every point."""
    ok = results[results["status"] == "ok"]
    grouped = ok.groupby(POINT, dropna=False)
    summary = grouped.agg(
        seeds=("seed", "nunique"), ppl_mean=("ppl", "mean"), ppl_std=("ppl", "std"),
        ppl_beyond_mean=("ppl_beyond", "mean"), ppl_beyond_std=("ppl_beyond", "std"), unigram_ppl=("unigram_ppl", "mean"),
    ).reset_index()  # fmt: skip
    unsupported = results[results["status"] != "ok"].groupby(POINT, dropna=False)["status"].first().reset_index()
    return pd.concat([summary, unsupported], ignore_index=True).sort_values(
        POINT, key=lambda column: column.map(natural_key) if column.name == "variant" else column, ignore_index=True
    )


def mean_std(mean: float, std: float) -> str:
    if pd.isna(mean):
        return ""
    return f"{mean:.1f}" if pd.isna(std) else f"{mean:.1f} ± {std:.1f}"


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
                cell += f" ({100 * (mean / base - 1):+.1f}%)"
            cells[eval_len] = cell
        if value == "ppl":
            unigram = group["unigram_ppl"].mean()
            cells["unigram"] = "" if pd.isna(unigram) else f"{unigram:.1f}"  # runs older than the column
        rows[key] = cells
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.names = LINE
    ordered = sorted(c for c in table.columns if c != "unigram") + (["unigram"] if "unigram" in table.columns else [])
    table = table[ordered].fillna("")
    return table.loc[:, (table != "").any()]


def to_markdown(table: pd.DataFrame) -> str:
    header = [*table.index.names, *(str(c) for c in table.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in table.iterrows():
        lines.append("| " + " | ".join([*(str(i) for i in index), *(str(v) for v in row)]) + " |")
    return "\n".join(lines)


def context_free_warnings(summary: pd.DataFrame, split: str) -> list[str]:
    """One line per model whose perplexity at its training length is close to the unigram reference."""
    df = summary[(summary["split"] == split) & (summary["eval_mode"] == "nonoverlapping") & (summary["eval_len"] == summary["train_len"])]
    return [
        f"- **{label(p.encoding, p.variant, p.train_len)}**: {split} perplexity {p.ppl_mean:.1f} at the training length is "
        f"not clearly below the unigram reference {p.unigram_ppl:.1f} (above {CONTEXT_FREE:.0%} of it): the model has "
        "barely learned to use context, so its extrapolation numbers mean little."
        for p in df.itertuples()
        if p.ppl_mean > CONTEXT_FREE * p.unigram_ppl
    ]


def mode_title(results: pd.DataFrame, mode: str) -> str:
    strides = sorted(results.loc[(results["eval_mode"] == mode) & (results["stride"] < results["eval_len"]), "stride"].unique())
    return f"{mode} (stride {', '.join(str(int(s)) for s in strides)})" if strides else mode


def encoding_colour(encoding: str):
    """An encoding's colour, the same in every figure and report: its place in the registry."""
    names = list(ENCODINGS)
    return plt.get_cmap("tab10")((names.index(encoding) if encoding in names else len(names)) % 10)


def line_styles(keys: list[tuple]) -> dict[tuple, dict]:
    """A colour per encoding; its variants share the colour with other dash patterns."""
    encodings = sorted({k[0] for k in keys})
    dashes = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3))]
    styles = {}
    for encoding in encodings:
        for j, key in enumerate(sorted((k for k in keys if k[0] == encoding), key=line_key)):
            styles[key] = dict(color=encoding_colour(encoding), linestyle=dashes[j % len(dashes)])
    return styles


def plain_ticks(ax) -> None:
    """Tick labels as plain numbers (512, not 2^9) on log axes."""
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)
    for axis in (ax.yaxis,) if ax.get_yscale() == "log" else ():
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)


def save_figure(fig, path: Path) -> None:
    """``path`` (.png) and the same figure as .svg beside it."""
    for target in (path, path.with_suffix(".svg")):
        atomic_write(target, lambda tmp, fmt=target.suffix[1:]: fig.savefig(tmp, dpi=120, format=fmt, bbox_inches="tight"))
    plt.close(fig)


def plot_ppl_vs_length(results: pd.DataFrame, summary: pd.DataFrame, split: str, path: Path) -> None:
    """A panel per eval mode: mean perplexity per line, a band for ± std, the unigram level dashed."""
    df = summary[(summary["split"] == split) & summary["ppl_mean"].notna()]
    modes = sorted(df["eval_mode"].unique(), key=lambda m: m != "nonoverlapping")
    styles = line_styles(list(df.groupby(LINE).groups))
    fig, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes), 4.8), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for key, group in by_line(df[df["eval_mode"] == mode]):
            group = group.sort_values("eval_len")
            ax.plot(group["eval_len"], group["ppl_mean"], marker="o", markersize=4, label=label(*key), **styles[key])
            std = group["ppl_std"].fillna(0)
            ax.fill_between(group["eval_len"], group["ppl_mean"] - std, group["ppl_mean"] + std, color=styles[key]["color"], alpha=0.15)
        unigram = df.loc[df["eval_mode"] == mode, "unigram_ppl"].mean()
        if not pd.isna(unigram):
            ax.axhline(unigram, color="black", linestyle="--", linewidth=1, label="unigram (no context)")
        for train_len in sorted(df["train_len"].unique()):
            ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_title(mode_title(results, mode))
        plain_ticks(ax)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"{split} perplexity (mean ± std over seeds)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    fig.suptitle("Perplexity vs evaluation length (dotted: training length)")
    fig.tight_layout()
    save_figure(fig, path)


def read_beside(root: Path, name: str) -> list[tuple[Path, pd.DataFrame]]:
    """Every readable ``name`` CSV in the run folders below ``root`` (the report folder excluded)."""
    frames = []
    for path in sorted(root.rglob(name)):
        if REPORT_DIR in path.relative_to(root).parts[:-1]:
            continue
        try:
            frames.append((path.parent, pd.read_csv(path)))
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
            log.warning("skipping %s: unreadable (%s)", path, e)
    return frames


def per_position_curves(root: Path, split: str, bins_per_octave: int = 4) -> tuple[pd.DataFrame, int | None]:
    """Mean NLL per (line, position bin) at the longest length in non-overlapping mode, pooled over seeds.

    Positions are grouped in log-spaced bins (``bins_per_octave`` per doubling), weighting
    each position by its token count; ``x`` is the bin's mean number of tokens in context + 1.
    """
    frames = [df for _, df in read_beside(root, PER_POSITION)]
    if not frames:
        return pd.DataFrame(), None
    df = normalise(pd.concat(frames, ignore_index=True))
    df = df[(df["split"] == split) & (df["eval_mode"] == "nonoverlapping")]
    if df.empty:
        return pd.DataFrame(), None
    longest = int(df["eval_len"].max())
    df = df[df["eval_len"] == longest].copy()
    df["bin"] = (np.log2(df["position"] + 1) * bins_per_octave).round()
    df["weighted_nll"], df["weighted_x"] = df["nll"] * df["count"], (df["position"] + 1) * df["count"]
    curves = df.groupby([*LINE, "bin"]).agg(weighted_nll=("weighted_nll", "sum"), weighted_x=("weighted_x", "sum"), count=("count", "sum")).reset_index()
    curves["nll"], curves["x"] = curves["weighted_nll"] / curves["count"], curves["weighted_x"] / curves["count"]
    return curves[[*LINE, "x", "nll", "count"]], longest


def plot_per_position(root: Path, split: str, path: Path) -> bool:
    curves, longest = per_position_curves(root, split)
    if curves.empty:
        return False
    styles = line_styles(list(curves.groupby(LINE).groups))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for key, group in by_line(curves):
        ax.plot(group["x"], group["nll"], label=label(*key), **styles[key])
    for train_len in sorted(curves["train_len"].unique()):
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the window + 1 (tokens of context + 1)")
    plain_ticks(ax)
    ax.set_ylabel(f"mean {split} NLL (nats)")
    ax.set_title(f"Loss by position, windows of {longest} tokens (dotted: training length)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def plot_training_curves(root: Path, path: Path) -> bool:
    """Validation loss vs tokens seen, mean over the seeds of each (encoding, train_len)."""
    frames = []
    for folder, log_df in read_beside(root, "train_log.csv"):
        try:
            run = pd.read_csv(folder / "results.csv", nrows=1)
        except (FileNotFoundError, pd.errors.ParserError, pd.errors.EmptyDataError):
            continue  # an unfinished run: collect_results lists it
        if "valid_loss" in log_df and "tokens" in log_df:
            valid = log_df.dropna(subset=["valid_loss"])
            frames.append(valid.assign(encoding=run["encoding"].iloc[0], train_len=run["train_len"].iloc[0]))
    if not frames:
        return False
    df = pd.concat(frames, ignore_index=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for (encoding, train_len), group in df.groupby(["encoding", "train_len"]):
        curve = group.groupby("tokens")["valid_loss"].mean()
        ax.plot(curve.index, curve.values, marker=".", color=encoding_colour(encoding), label=label(encoding, "", train_len))
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("validation loss (nats, mean over seeds)")
    ax.set_title("Training curves")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def report(root: Path) -> Path:
    """Write DIR/report/: results.csv (every row), summary.csv (mean, std per point), summary.md, figures."""
    root = Path(root)
    if not root.is_dir():
        raise PosbenchError(f"{root} is not a folder")
    results, skipped = collect_results(root)
    results = normalise(results)
    summary = aggregate(results)
    out = root / REPORT_DIR
    write_csv(results, out / "results.csv")
    write_csv(summary, out / "summary.csv")
    splits = [s for s in ("test", "valid") if s in set(results["split"])]
    sections = [
        f"# posbench report\n\n{results['run_dir'].nunique()} runs under `{root}`. Cells: mean ± sample standard "
        "deviation over seeds (the `seeds` column of summary.csv says how many); in brackets the change of the "
        "mean relative to the training length; `unigram`: the perplexity of a model that ignores context "
        "(training-split frequencies)."
    ]
    warnings = context_free_warnings(summary, splits[0])
    if warnings:
        sections.append("## Models that barely use context\n\n" + "\n".join(warnings))
    for split in splits:
        for mode in sorted(set(summary.loc[summary["split"] == split, "eval_mode"]), key=lambda m: m != "nonoverlapping"):
            sections.append(f"## {split} perplexity, {mode_title(results, mode)}\n\n{to_markdown(summary_table(summary, split, mode))}")
            beyond = summary_table(summary, split, mode, value="ppl_beyond")
            sections.append(
                f"### {split}, {mode}: perplexity of the tokens at window positions ≥ train_len only\n\n{to_markdown(beyond)}"
            )
    if skipped:
        sections.append("## Runs left out\n\n" + "\n".join(f"- `{run}`: {reason}" for run, reason in skipped.items()))
    write_text("\n\n".join(sections) + "\n", out / "summary.md")
    plot_ppl_vs_length(results, summary, splits[0], out / "ppl_vs_length.png")
    plot_per_position(root, splits[0], out / "per_position_loss.png")
    plot_training_curves(root, out / "training_curves.png")
    return out
