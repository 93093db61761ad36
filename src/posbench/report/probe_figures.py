"""The probes' figures, as PNG and SVG: context_usage, copy_probe, attention_entropy, bias_curves.
Means over seeds of the model as trained; each encoding keeps its colour from ``figures``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ..probes.suite import ATTENTION_CSV, BIAS_CSV, CONTEXT_CSV, COPY_CSV
from .collect import Runs
from .figures import line_styles, plain_ticks, save_figure
from .probes import as_trained
from .tables import LINE, by_line, label, unlabelled_single_precision


def seed_means(table: pd.DataFrame, x: str, y: str, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """Mean of ``y`` over seeds (and whatever else varies) per line, ``extra`` columns and ``x``."""
    ok = as_trained(table)
    ok = ok[ok["status"] == "ok"] if "status" in ok else ok
    return ok.groupby([*LINE, *extra, x], as_index=False)[y].mean()


def draw_lines(ax, curves: pd.DataFrame, x: str, y: str, colours: dict) -> None:
    """A line per (encoding, variant, train_len), the training lengths dotted."""
    styles = line_styles(list(curves.groupby(LINE).groups), colours)
    for key, group in by_line(curves):
        ax.plot(group[x], group[y], marker="o", markersize=3, label=label(*key), **styles[key])
    for train_len in sorted(curves["train_len"].unique()):
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
    ax.grid(True, which="both", alpha=0.3)


def finish(fig: Figure, ax, title: str, path: Path) -> None:
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)


def plot_context_usage(table: pd.DataFrame, colours: dict, path: Path) -> bool:
    """nll against context k (log x): all targets, and those only far context can help (repeat_far)."""
    curves = seed_means(table[table["split"] == "test"], "context", "nll", ("subset",)) if len(table) else table
    if curves.empty:
        return False
    fig = Figure(figsize=(13, 4.8))
    axes = fig.subplots(1, 2)
    for ax, subset in zip(axes, ("all", "repeat_far")):
        draw_lines(ax, curves[curves["subset"] == subset], "context", "nll", colours)
        ax.set_xscale("log", base=2)
        plain_ticks(ax)
        ax.set_xlabel("left context k (tokens)")
        ax.set_ylabel(f"mean test nll, {subset} targets (nats)")
        ax.set_title(subset)
    finish(fig, axes[0], "Context usage (dotted: training length)", path)
    return True


def plot_copy_probe(table: pd.DataFrame, colours: dict, path: Path, spans: str = "") -> bool:
    """Copy gain against the distance between the span and its repeat (``spans``: what they drew from)."""
    curves = seed_means(table, "distance", "gain") if len(table) else table
    if curves.empty:
        return False
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    draw_lines(ax, curves, "distance", "gain", colours)
    ax.set_xscale("symlog", base=2, linthresh=16)  # d = 0 stays on the axis
    ax.set_xlim(left=0)
    plain_ticks(ax)
    ax.axhline(0, color="black", linewidth=1)
    ax.set_xlabel("distance d (tokens of text between the span and its repeat)")
    ax.set_ylabel("gain = nll_baseline − nll_copy (nats)")
    finish(fig, ax, f"Long-range copy{spans} (dotted: training length)", path)
    return True


def plot_attention_entropy(table: pd.DataFrame, colours: dict, path: Path) -> bool:
    """Attention entropy, mean over layers, heads and seeds, against the eval length."""
    curves = seed_means(table, "eval_len", "entropy") if len(table) else table
    if curves.empty:
        return False
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    draw_lines(ax, curves, "eval_len", "entropy", colours)
    ax.set_xscale("log", base=2)
    plain_ticks(ax)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("attention entropy (nats, mean over layers, heads)")
    finish(fig, ax, "Attention entropy (dotted: training length)", path)
    return True


def plot_bias_curves(table: pd.DataFrame, colours: dict, path: Path) -> bool:
    """b_h(d) per head, a panel per (encoding, variant, train_len) of a bias encoding."""
    curves = seed_means(table, "distance", "bias", ("head",)) if len(table) else table
    if curves.empty:
        return False
    lines = by_line(curves)
    columns = min(4, len(lines))
    rows = -(-len(lines) // columns)
    fig = Figure(figsize=(4 * columns, 3.4 * rows))
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, (key, group) in zip(axes, lines):
        for head, curve in group.groupby("head"):
            ax.plot(curve["distance"], curve["bias"], color=colours[key[0]], alpha=0.35 + 0.65 * (head % 2))
        ax.axvline(key[2], color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("symlog", base=2, linthresh=1)
        ax.set_xlim(left=0)
        plain_ticks(ax)
        ax.set_title(label(*key), fontsize=10)
        ax.set_xlabel("distance d (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[len(lines) :]:
        ax.set_visible(False)
    axes[0].set_ylabel("bias b_h(d), a line per head")
    fig.suptitle("Attention bias by distance (dotted: training length)")
    fig.tight_layout()
    save_figure(fig, path)
    return True


def draw_probe_figures(runs: Runs, colours: dict, out: Path, results: pd.DataFrame) -> None:
    """The probes' figures into ``out`` (each only where some run has its CSV); lines name their precision
    only where ``results`` hold several."""

    def rows(name: str) -> pd.DataFrame:
        table = runs.rows(name)
        return table if table.empty else unlabelled_single_precision(table, results)

    plot_context_usage(rows(CONTEXT_CSV), colours, out / "context_usage.png")
    copies = rows(COPY_CSV)
    words = copies.reindex(columns=["vocab"])["vocab"]
    plot_copy_probe(copies[words.isna()], colours, out / "copy_probe.png")
    for n in sorted(words.dropna().unique()):  # spans from the n most frequent words: a figure each
        plot_copy_probe(copies[words == n], colours, out / f"copy_probe_vocab{n}.png", f", spans of {n} words")
    plot_attention_entropy(rows(ATTENTION_CSV), colours, out / "attention_entropy.png")
    plot_bias_curves(rows(BIAS_CSV), colours, out / "bias_curves.png")
