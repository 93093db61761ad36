"""The task track in the report: task_results.csv of every finished run below DIR (docs/tasks.md).

``collect_tasks`` reads the rows (a task run has no results.csv: it is read here, not by ``collect_runs``),
``task_summary`` averages over seeds, ``task_markdown`` writes a table per task of accuracy against eval_len
and distance, ``draw_task_figures`` a figure per task, ``task_<name>``: accuracy against distance /
train_len, a panel per eval_len, a line per encoding and variant, ``draw_task_heatmaps`` a second,
``task_<name>_heatmap``: a heat map per line of accuracy by distance and eval_len (``task_heatmaps``), and
``draw_learning_curves`` a third, ``task_<name>_learning``: each run's validation accuracy at train_len against
the step (``learning_curves``, from its train_log.csv), so that a run that did not learn shows how far it got.

A seed that did not learn its task (status ``not_learned``) is not averaged in; a cell whose seeds all
failed to learn says so, as does one whose length the encoding cannot serve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..markdown import markdown_table
from ..runfolder import TASK_RESULTS, TRAIN_LOG, find
from ..tasks.measure import LEARNED_ACCURACY
from .collect import collect_finished_rows
from .csvs import read_table
from .figures import PANELS_PER_ROW, line_styles, plain_ticks, save_figure
from .tables import label, line_key

#: What one line of the task table and figures is: a model as trained and as evaluated.
TASK_LINE = ["task", "encoding", "variant", "train_len", "train_lengths"]
GEOMETRY = ["eval_len", "distance"]
#: The heat maps' last distance row: per eval_len, the largest distance held there alone.
LONGEST = math.inf
#: Heat map panels of more cells than this leave the numbers out: they would not be legible.
MAX_ANNOTATED_CELLS = 80


def collect_tasks(root: Path) -> tuple[pd.DataFrame, dict[Path, str]]:
    """Every finished run's task_results.csv rows below ``root``, and what was left out of which folder."""
    rows, left_out = collect_finished_rows(root, TASK_RESULTS)
    if len(rows):
        rows["train_lengths"] = rows["train_lengths"].astype(str)
    return rows, left_out


def task_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (line, eval_len, distance): accuracy, token accuracy and NLL as mean and std over the seeds
    that learned the task (status ok), ``seeds`` of them; ``not_learned`` and ``unsupported`` count the others."""
    ok = rows[rows["status"] == "ok"]
    keys = [*TASK_LINE, *GEOMETRY]
    measured = ok.groupby(keys, dropna=False).agg(
        accuracy_mean=("accuracy", "mean"),
        accuracy_std=("accuracy", "std"),
        token_accuracy_mean=("token_accuracy", "mean"),
        nll_mean=("nll", "mean"),
        seeds=("seed", "nunique"),
    )
    counts = rows.groupby(keys, dropna=False).agg(
        not_learned=("status", lambda s: int((s == "not_learned").sum())),
        unsupported=("status", lambda s: int((s == "unsupported").sum())),
    )
    summary = counts.join(measured, how="left").reset_index()
    summary["seeds"] = summary["seeds"].fillna(0).astype(int)
    return summary


def task_runs(rows: pd.DataFrame, task: str) -> pd.DataFrame:
    """One row per run of ``task`` (its first), with ``learned``: no row of the run is ``not_learned``."""
    rows = rows[rows["task"] == task]
    not_learned = (rows["status"] == "not_learned").groupby(rows["run_id"]).transform("any")
    return rows.assign(learned=~not_learned).drop_duplicates("run_id")


def seeds_learned(runs: pd.DataFrame) -> str:
    """``k of n``: how many of these runs (rows of ``task_runs``) learned their task."""
    return f"{int(runs['learned'].sum())} of {len(runs)}"


def steps_markdown(rows: pd.DataFrame, task: str) -> str:
    """Per line: how many seeds learned the task, and the steps (mean over seeds) to the first validation at
    ≥ 0.95 (learned_step), to the best model and to where training stopped."""
    table = []
    for key, group in task_runs(rows, task).groupby(TASK_LINE[1:], dropna=False):
        steps = [group[c].mean() if c in group else float("nan") for c in ("learned_step", "best_step", "stopped_step")]
        shown = ["" if pd.isna(v) else f"{v:,.0f}" for v in steps]
        table.append([*key, seeds_learned(group), f"{group['valid_accuracy'].mean():.3f}", *shown])
    header = [*TASK_LINE[1:], "learned", "valid_accuracy", "learned_step", "best_step", "stopped_step"]
    return markdown_table(header, table)


def cell(row: pd.Series) -> str:
    """A table cell: ``0.93 ± 0.02`` (± only over several seeds), or why there is no number."""
    if row["seeds"]:
        spread = f" ± {row['accuracy_std']:.2f}" if row["seeds"] > 1 else ""
        failed = f" ({row['not_learned']} not learned)" if row["not_learned"] else ""
        return f"{row['accuracy_mean']:.2f}{spread}{failed}"
    return "not learned" if row["not_learned"] else "unsupported"


def shared_distances(df: pd.DataFrame) -> list:
    """A task's distances measured at several eval_lens (all of them where there is one eval_len); each of
    the others is measured at one eval_len alone, and tables put it under ``longest``."""
    lengths_at = df.groupby("distance")["eval_len"].nunique()
    return sorted(lengths_at.index[(lengths_at > 1) | (df["eval_len"].nunique() == 1)])


def task_markdown(summary: pd.DataFrame, raw: pd.DataFrame) -> list[str]:
    """summary.md's sections: per task, accuracy (exact match of the answer) by line and eval_len against
    distance; a distance measured at one eval_len alone (by default the longest each holds, the source at
    the very start) goes to the column ``longest``, its value beside the accuracy."""
    sections = []
    for task, df in summary.groupby("task"):
        shared = shared_distances(df)
        rows = []
        for key, group in df.groupby(["encoding", "variant", "train_len", "eval_len"]):
            cells = dict(zip(group["distance"], group.apply(cell, axis=1)))
            alone = [f"{cells[d]} (d={int(d)})" for d in sorted(cells) if d not in shared]
            rows.append([*key[:2], *map(int, key[2:]), *(cells.get(d, "") for d in shared), ", ".join(alone)])
        header = ["encoding", "variant", "train_len", "eval_len", *(f"d={int(d)}" for d in shared), "longest"]
        sections.append(
            f"## Task {task}: accuracy against eval_len and distance\n\nExact match of the whole answer, mean ± std "
            "over the seeds that learned the task (accuracy ≥ 0.95 at train_len); `not learned`: no seed did. "
            "d: filler tokens between the source and its query; `longest`: the source at the start of the "
            f"sequence.\n\n{markdown_table(header, rows)}"
        )
        sections.append(
            f"### Task {task}: seeds that learned it, and the steps they took\n\n{steps_markdown(raw, task)}\n\n"
            f"Learning curves (validation accuracy at train_len against the step): `task_{task}_learning.png`."
        )
    return sections


def tasks_markdown(root: Path, rows: pd.DataFrame, sections: list[str], left_out: dict[Path, str]) -> str:
    """summary.md of a folder holding task runs alone."""
    parts = [f"# posbench report\n\n{rows['run_id'].nunique()} task runs under `{root}`.", *sections]
    if left_out:
        parts.append("## Runs left out\n\n" + "\n".join(f"- `{run}`: {reason}" for run, reason in left_out.items()))
    return "\n\n".join(parts) + "\n"


def draw_task_figures(summary: pd.DataFrame, colours: dict[str, str], out: Path) -> None:
    """task_<name>.png/.svg: accuracy against distance / train_len, a panel per eval_len, a line per model."""
    for task, df in summary[summary["seeds"] > 0].groupby("task"):
        lengths = sorted(df["eval_len"].unique())
        lines = list(df.groupby(["encoding", "variant"]).groups)
        styles = line_styles(lines, colours)
        columns = min(3, len(lengths))
        fig = Figure(figsize=(4.5 * columns, 3.6 * -(-len(lengths) // columns)))
        axes = fig.subplots(-(-len(lengths) // columns), columns, sharey=True, squeeze=False).flatten()
        for ax, length in zip(axes, lengths):
            for (encoding, variant), group in df[df["eval_len"] == length].groupby(["encoding", "variant"]):
                group = group.sort_values("distance")
                x = group["distance"] / group["train_len"]
                name = encoding + (f" {variant}" if variant else "")
                ax.errorbar(
                    x,
                    group["accuracy_mean"],
                    yerr=group["accuracy_std"].fillna(0),
                    marker="o",
                    markersize=3,
                    capsize=2,
                    label=name,
                    **styles[(encoding, variant)],
                )
            ax.set_xscale("symlog", linthresh=0.25)
            ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
            ax.set(title=f"eval_len {length}", xlabel="distance / train_len", ylim=(-0.03, 1.03))
            plain_ticks(ax)
            ax.grid(True, which="both", alpha=0.3)
        for ax in axes[len(lengths) :]:
            ax.set_visible(False)
        axes[0].set_ylabel("accuracy (exact match)")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
        fig.suptitle(f"Task {task}: accuracy against distance (dotted: train_len; learned seeds only)")
        fig.tight_layout()
        save_figure(fig, out / f"task_{task}.png")


@dataclass
class HeatMap:
    """One panel of task_<name>_heatmap: a line's accuracy by distance row (rows: ``heatmap_rows``) and
    eval_len, NaN where nothing was measured; ``unsupported`` where the encoding cannot serve the length."""

    name: str
    train_len: int
    accuracy: pd.DataFrame
    unsupported: pd.DataFrame
    learned: bool


def heatmap_rows(df: pd.DataFrame) -> pd.Series:
    """Each summary row's row on a task's heat maps: its distance, or ``LONGEST`` for the largest distance a
    line holds alone at an eval_len (the source at the start: eval_len − 9 by default, one row for all lengths)."""
    alone = ~df["distance"].isin(shared_distances(df))
    largest = df[alone].groupby([*TASK_LINE, "eval_len"])["distance"].transform("max")
    longest = alone & (df["distance"] == largest.reindex(df.index))
    return df["distance"].astype(float).mask(longest, LONGEST)


def task_heatmaps(df: pd.DataFrame) -> list[HeatMap]:
    """A heat map per line of one task's summary rows, all on the same rows and eval_lens."""
    df = df.assign(row=heatmap_rows(df), cannot=(df["seeds"] == 0) & (df["unsupported"] > 0))
    rows, lengths = sorted(df["row"].unique()), sorted(df["eval_len"].unique())
    # lines of one encoding and variant trained at other lengths: their titles name the training lengths
    several = df[TASK_LINE[1:]].drop_duplicates().duplicated(["encoding", "variant"]).any()
    maps = []
    for key, line in sorted(df.groupby(TASK_LINE[1:]), key=lambda item: line_key(item[0])):
        encoding, variant, train_len, train_lengths = key
        name = label(encoding, variant, train_len, train_lengths=train_lengths) if several else label(encoding, variant)
        # a line none of whose seeds learned the task has no number anywhere: its panel says so, rather than vanish
        learned = bool(line["seeds"].sum()) or not line["not_learned"].sum()
        # as numbers: a cell absent from the line is NaN in both, so not unsupported either (NaN == 1 is False)
        cells = line.pivot(index="row", columns="eval_len", values=["accuracy_mean", "cannot"]).astype(float)
        accuracy, cannot = (
            cells[column].reindex(index=rows, columns=lengths) for column in ("accuracy_mean", "cannot")
        )
        maps.append(HeatMap(name, int(train_len), accuracy, cannot == 1, learned))
    return maps


def draw_heatmap(ax, heatmap: HeatMap, colours) -> None:
    """One line's panel: a cell per (distance row, eval_len), its accuracy written in where cells are few
    enough to hold it; unsupported cells hatched; a line that never learned the task greyed and said so."""
    accuracy = heatmap.accuracy.to_numpy(dtype=float)
    ax.imshow(accuracy, cmap=colours, vmin=0, vmax=1, aspect="auto")
    annotate = accuracy.size <= MAX_ANNOTATED_CELLS
    for (i, j), value in np.ndenumerate(accuracy):
        if heatmap.unsupported.iat[i, j]:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.5", linewidth=0))
        elif annotate and not np.isnan(value):
            ink = "white" if value < 0.5 else "black"  # legible on viridis' dark low and light high end
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6.5, color=ink)
    if not heatmap.learned:
        ax.set_facecolor("0.8")
        ax.text(0.5, 0.5, "no seed learned the task", transform=ax.transAxes, ha="center", va="center", fontsize=8)
    ax.set_title(heatmap.name + ("" if heatmap.learned else " (not learned)"), fontsize=10)
    lengths, distances = heatmap.accuracy.columns, heatmap.accuracy.index
    ax.set_xticks(range(len(lengths)), [f"{n}\n{n / heatmap.train_len:g}×" for n in lengths], fontsize=7)
    ax.set_yticks(range(len(distances)), ["longest" if d == LONGEST else f"{d:g}" for d in distances], fontsize=7)
    ax.set_xlabel(f"eval_len (× train_len {heatmap.train_len})", fontsize=8)
    ax.set_ylabel("distance", fontsize=8)


def draw_task_heatmaps(summary: pd.DataFrame, out: Path) -> None:
    """task_<name>_heatmap.png/.svg: a panel per line, accuracy by distance and eval_len, one colour scale."""
    # not measured: transparent, so the panel's background shows (white, or grey where nothing was learned)
    colours = colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))
    for task, df in summary.groupby("task"):
        maps = task_heatmaps(df)
        rows, columns = -(-len(maps) // PANELS_PER_ROW), min(len(maps), PANELS_PER_ROW)
        # at least wide enough for the title's key, for a task of a line or two
        fig = Figure(figsize=(max(3.4 * columns + 1.2, 7.5), 3.2 * rows + 0.8), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False).flatten()
        for ax, heatmap in zip(axes, maps):
            draw_heatmap(ax, heatmap, colours)
        for ax in axes[len(maps) :]:
            ax.set_visible(False)
        scale = ScalarMappable(Normalize(0, 1), colours)
        fig.colorbar(scale, ax=axes, shrink=0.7 if rows > 1 else 0.9, label="accuracy (exact match)")
        fig.suptitle(
            f"Task {task}: accuracy by distance and eval_len, mean over the seeds that learned it\n"
            "longest: the source at the start; blank: not measured; hatched: length unsupported",
            fontsize=11,
        )
        save_figure(fig, out / f"task_{task}_heatmap.png")


def learning_curves(rows: pd.DataFrame) -> pd.DataFrame:
    """Each task run's validation accuracy at train_len against the step, from the train_log.csv beside its
    task_results.csv: columns TASK_LINE, seed, learned, step, valid_accuracy; empty where no run logged one."""
    frames = []
    for run_dir, run in rows.groupby("run_dir"):
        path = find(Path(run_dir), TRAIN_LOG)
        log = read_table(path, TRAIN_LOG)[0] if path else None
        if log is None or "valid_accuracy" not in log:
            continue
        curve = log.dropna(subset=["valid_accuracy"])[["step", "valid_accuracy"]]
        identity = run.iloc[0][[*TASK_LINE, "seed"]]
        frames.append(curve.assign(**identity, learned=not (run["status"] == "not_learned").any()))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def draw_learning_curves(rows: pd.DataFrame, colours: dict[str, str], out: Path) -> None:
    """task_<name>_learning.png/.svg: validation accuracy at train_len against the step, a line per run (the
    seeds of a line share its style), the threshold of ``learned`` dashed."""
    curves = learning_curves(rows)
    for task, df in curves.groupby("task") if len(curves) else ():
        lines = list(df.groupby(["encoding", "variant"]).groups)
        styles = line_styles(lines, colours)
        fig = Figure(figsize=(8.5, 4.2))
        ax = fig.subplots()
        for (encoding, variant), line in df.groupby(["encoding", "variant"]):
            name = encoding + (f" {variant}" if variant else "") + ("" if line["learned"].all() else " (not learned)")
            for i, (_, run) in enumerate(line.groupby("seed")):
                ax.plot(run["step"], run["valid_accuracy"], label=None if i else name, **styles[(encoding, variant)])
        ax.axhline(LEARNED_ACCURACY, color="grey", linestyle="--", linewidth=1)
        ax.set(xlabel="step", ylabel="validation accuracy at train_len", ylim=(-0.03, 1.03))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
        ax.set_title(f"Task {task}: learning curves, a line per seed (dashed: learned at {LEARNED_ACCURACY})")
        fig.tight_layout()
        save_figure(fig, out / f"task_{task}_learning.png")
