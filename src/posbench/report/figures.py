"""The report's figures, as PNG and SVG: perplexity vs length (and vs length / train_len where an encoding
was trained at several lengths), loss by position, training curves, and the loss at each of train.val_lens
against the step (``val_lens.py``).
Pure functions of what ``collect_runs`` returned; each encoding keeps one colour in every figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import pandas as pd
from matplotlib.colors import hsv_to_rgb, to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .collect import PER_POSITION, Runs
from .tables import (
    LINE,
    by_line,
    eval_modes,
    label,
    line_key,
    mode_title,
    normalise,
    per_position_curves,
    training_curves,
    unlabelled_single_precision,
)
from .val_lens import val_lens_curves

#: Each encoding's colour in every figure (matplotlib's tab10, in the order the encodings were added).
ENCODING_COLOURS = {
    "alibi": "#1f77b4",
    "rope": "#ff7f0e",
    "sinusoidal": "#2ca02c",
    "learned": "#d62728",
    "none": "#9467bd",
    "t5": "#8c564b",
    "kerple_log": "#e377c2",
    "kerple_power": "#7f7f7f",
    "fire": "#bcbd22",
    "xpos": "#17becf",
}
#: Colours for encodings outside ENCODING_COLOURS, first: tab20's light shades of the tab10 colours.
FALLBACK_COLOURS = (
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
#: Panels per row in figures of one panel per line.
PANELS_PER_ROW = 4
DASHES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3))]


def encoding_colours(encodings: Iterable[str]) -> dict[str, str]:
    """A colour per encoding: its own from ENCODING_COLOURS, or for the others (in name order) one that
    is neither there nor given to another of ``encodings``."""
    encodings = set(encodings)
    others = sorted(encodings - set(ENCODING_COLOURS))
    # beyond the fallbacks, evenly spaced hues at a brightness no fixed or fallback colour has
    hues = [to_hex(hsv_to_rgb((i / len(others), 0.6, 0.6))) for i in range(len(others))]
    taken = set(ENCODING_COLOURS.values())
    spare = [colour for colour in dict.fromkeys([*FALLBACK_COLOURS, *hues]) if colour not in taken]
    return {e: c for e, c in ENCODING_COLOURS.items() if e in encodings} | dict(zip(others, spare))


def line_styles(keys: list[tuple], colours: dict[str, str]) -> dict[tuple, dict]:
    """A colour per encoding; its variants share the colour with other dash patterns."""
    styles = {}
    for encoding in sorted({k[0] for k in keys}):
        for j, key in enumerate(sorted((k for k in keys if k[0] == encoding), key=line_key)):
            styles[key] = dict(color=colours[encoding], linestyle=DASHES[j % len(DASHES)])
    return styles


def plain_ticks(ax) -> None:
    """Tick labels as plain numbers (512, not 2^9) on log axes."""
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)
    for axis in (ax.yaxis,) if ax.get_yscale() == "log" else ():
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)


def save_figure(fig: Figure, path: Path) -> None:
    """``path`` (.png) and the same figure as .svg beside it."""
    for target in (path, path.with_suffix(".svg")):
        fig.savefig(target, dpi=120, format=target.suffix[1:], bbox_inches="tight")


def plot_ppl_vs_length(results: pd.DataFrame, summary: pd.DataFrame, split: str, colours: dict, path: Path) -> None:
    """A panel per eval mode: mean perplexity per line, a band for ± std, the unigram level dashed."""
    df = summary[(summary["split"] == split) & summary["ppl_mean"].notna()]
    modes = eval_modes(df)
    styles = line_styles(list(df.groupby(LINE).groups), colours)
    fig = Figure(figsize=(6.5 * len(modes), 4.8))
    axes = fig.subplots(1, len(modes), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for key, group in by_line(df[df["eval_mode"] == mode]):
            group = group.sort_values("eval_len")
            ax.plot(group["eval_len"], group["ppl_mean"], marker="o", markersize=4, label=label(*key), **styles[key])
            low, high = group["ppl_mean"] - group["ppl_std"].fillna(0), group["ppl_mean"] + group["ppl_std"].fillna(0)
            ax.fill_between(group["eval_len"], low, high, color=styles[key]["color"], alpha=0.15)
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


def length_ratio_curves(summary: pd.DataFrame, split: str) -> pd.DataFrame:
    """Mean perplexity of each plain model (no variant, one training length, non-overlapping windows) by
    ``ratio`` = eval_len / train_len, for the encodings trained at two or more lengths (else empty)."""
    df = summary[(summary["split"] == split) & summary["ppl_mean"].notna() & (summary["eval_mode"] == "nonoverlapping")]
    df = df[df["variant"] == ""]
    if "train_lengths" in df:
        df = df[df["train_lengths"].astype(str) == df["train_len"].astype(str)]
    lengths = df.groupby("encoding")["train_len"].nunique()
    df = df[df["encoding"].isin(lengths[lengths > 1].index)]
    return df.assign(ratio=df["eval_len"] / df["train_len"])[["encoding", "train_len", "ratio", "ppl_mean"]]


def plot_ppl_vs_length_ratio(summary: pd.DataFrame, split: str, colours: dict, path: Path) -> bool:
    """A panel per encoding trained at several lengths: perplexity vs eval_len / train_len, a line per
    train_len (darker: longer); False if no encoding was."""
    curves = length_ratio_curves(summary, split)
    if curves.empty:
        return False
    encodings = sorted(curves["encoding"].unique())
    fig = Figure(figsize=(4.2 * len(encodings), 4.2))
    axes = fig.subplots(1, len(encodings), sharey=True, squeeze=False)[0]
    for ax, encoding in zip(axes, encodings):
        lengths = sorted(curves.loc[curves["encoding"] == encoding, "train_len"].unique())
        for i, train_len in enumerate(lengths):
            line = curves[(curves["encoding"] == encoding) & (curves["train_len"] == train_len)].sort_values("ratio")
            alpha = 0.35 + 0.65 * (i + 1) / len(lengths)
            ax.plot(
                line["ratio"],
                line["ppl_mean"],
                marker="o",
                markersize=4,
                color=colours[encoding],
                alpha=alpha,
                linestyle=DASHES[i % len(DASHES)],
                label=f"train_len {train_len}",
            )
        ax.axvline(1, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("eval_len / train_len")
        ax.set_title(encoding)
        plain_ticks(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, frameon=False)
    axes[0].set_ylabel(f"{split} perplexity (mean over seeds)")
    fig.suptitle("Perplexity vs evaluation length in training lengths")
    fig.tight_layout()
    save_figure(fig, path)
    return True


def plot_per_position(per_position: pd.DataFrame, split: str, colours: dict, path: Path) -> bool:
    """Mean loss by position in the longest windows, a line per (encoding, variant, train_len); False if no data."""
    curves, longest = per_position_curves(per_position, split)
    if curves.empty:
        return False
    styles = line_styles(list(curves.groupby(LINE).groups), colours)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
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


def plot_training_curves(curves: pd.DataFrame, marks: pd.DataFrame, colours: dict, path: Path) -> bool:
    """Validation loss vs tokens seen, a line per (encoding, train_len, train_lengths) (mean over seeds), each
    run's stop marked × and its best validation ○; False if no run logged one."""
    if curves.empty:
        return False
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    styles = line_styles(list(curves.groupby(LINE).groups), colours)
    for key, curve in by_line(curves):
        ax.plot(curve["tokens"], curve["valid_loss"], marker=".", label=label(*key), **styles[key])
    stopped, best = marks[marks["stopped"]], marks[marks["best"]]
    stop_colours, best_colours = ([colours[e] for e in points["encoding"]] for points in (stopped, best))
    ax.scatter(stopped["tokens"], stopped["valid_loss"], marker="x", s=50, c=stop_colours, zorder=3)
    ax.scatter(
        best["tokens"], best["valid_loss"], marker="o", s=40, facecolors="none", edgecolors=best_colours, zorder=3
    )
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("validation loss (nats, mean over seeds)")
    ax.set_title("Training curves (×: where each run stopped, ○: its best validation loss)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
    return True


def plot_val_lens_curves(curves: pd.DataFrame, colours: dict, path: Path) -> bool:
    """A panel per line: the loss at each length against the step, darker for longer; False if no data."""
    if curves.empty:
        return False
    lines = by_line(curves)
    rows, columns = math.ceil(len(lines) / PANELS_PER_ROW), min(len(lines), PANELS_PER_ROW)
    fig = Figure(figsize=(4.2 * columns, 3.8 * rows))
    axes = fig.subplots(rows, columns, sharey=True, squeeze=False).flatten()
    for ax, (key, group) in zip(axes, lines):
        lengths = sorted(group["length"].unique())
        for i, length in enumerate(lengths):
            line = group[group["length"] == length].sort_values("step")
            style = dict(
                color=colours[key[0]], alpha=0.3 + 0.7 * (i + 1) / len(lengths), linestyle=DASHES[i % len(DASHES)]
            )
            ax.plot(line["step"], line["loss"], marker=".", label=f"{length} ({length / key[2]:g}× train_len)", **style)
        ax.set_title(label(*key), fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, frameon=False)
    for ax in axes[len(lines) :]:
        ax.set_visible(False)
    for ax in axes[::columns]:
        ax.set_ylabel("validation loss (nats, mean over seeds)")
    fig.suptitle("Validation loss at each length during training (train.val_lens)")
    fig.tight_layout()
    save_figure(fig, path)
    return True


def draw_figures(runs: Runs, results: pd.DataFrame, summary: pd.DataFrame, split: str, out: Path) -> None:
    """Every figure of the report into ``out``, ``split`` measured; an encoding has one colour in all."""
    per_position = runs.rows(PER_POSITION)
    if not per_position.empty:
        per_position = unlabelled_single_precision(normalise(per_position), results)
    colours = encoding_colours({*results["encoding"], *per_position.get("encoding", [])})
    plot_ppl_vs_length(results, summary, split, colours, out / "ppl_vs_length.png")
    plot_ppl_vs_length_ratio(summary, split, colours, out / "ppl_vs_length_ratio.png")
    plot_per_position(per_position, split, colours, out / "per_position_loss.png")
    curves, marks = training_curves(runs.reported)
    plot_training_curves(unlabelled_single_precision(curves, results), marks, colours, out / "training_curves.png")
    by_length = unlabelled_single_precision(val_lens_curves(runs.reported), results)
    plot_val_lens_curves(by_length, colours, out / "val_lens_curves.png")
