"""The task track in the report: task_results.csv of every finished run below DIR (docs/tasks.md).

``collect_tasks`` reads the rows (a task run has no results.csv: it is read here, not by ``collect_runs``),
``task_summary`` averages over seeds, ``task_markdown`` writes a table per task of accuracy against eval_len
and distance, and ``draw_task_figures`` a figure per task, ``task_<name>``: accuracy against distance /
train_len, a panel per eval_len, a line per encoding and variant.

A seed that did not learn its task (status ``not_learned``) is not averaged in; a cell whose seeds all
failed to learn says so, as does one whose length the encoding cannot serve.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ..markdown import markdown_table
from ..runfolder import TASK_RESULTS
from .collect import collect_finished_rows
from .figures import line_styles, plain_ticks, save_figure

#: What one line of the task table and figures is: a model as trained and as evaluated.
TASK_LINE = ["task", "encoding", "variant", "train_len", "train_lengths"]
GEOMETRY = ["eval_len", "distance"]


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


def steps_markdown(rows: pd.DataFrame, task: str) -> str:
    """Per line: how many seeds learned the task, and the steps (mean over seeds) to the first validation at
    ≥ 0.95 (learned_step), to the best model and to where training stopped."""
    runs = rows[rows["task"] == task].drop_duplicates("run_id")
    table = []
    for key, group in runs.groupby(TASK_LINE[1:], dropna=False):
        learned = group["status"] != "not_learned"
        steps = [group[c].mean() if c in group else float("nan") for c in ("learned_step", "best_step", "stopped_step")]
        shown = ["" if pd.isna(v) else f"{v:,.0f}" for v in steps]
        table.append([*key, f"{int(learned.sum())} of {len(group)}", f"{group['valid_accuracy'].mean():.3f}", *shown])
    header = [*TASK_LINE[1:], "learned", "valid_accuracy", "learned_step", "best_step", "stopped_step"]
    return markdown_table(header, table)


def cell(row: pd.Series) -> str:
    """A table cell: ``0.93 ± 0.02`` (± only over several seeds), or why there is no number."""
    if row["seeds"]:
        spread = f" ± {row['accuracy_std']:.2f}" if row["seeds"] > 1 else ""
        failed = f" ({row['not_learned']} not learned)" if row["not_learned"] else ""
        return f"{row['accuracy_mean']:.2f}{spread}{failed}"
    return "not learned" if row["not_learned"] else "unsupported"


def task_markdown(summary: pd.DataFrame, raw: pd.DataFrame) -> list[str]:
    """summary.md's sections: per task, accuracy (exact match of the answer) by line and eval_len against
    distance; a distance measured at one eval_len alone (by default the longest each holds, the source at
    the very start) goes to the column ``longest``, its value beside the accuracy."""
    sections = []
    for task, df in summary.groupby("task"):
        lengths_at = df.groupby("distance")["eval_len"].nunique()
        shared = sorted(lengths_at.index[(lengths_at > 1) | (df["eval_len"].nunique() == 1)])
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
            f"### Task {task}: seeds that learned it, and the steps they took\n\n{steps_markdown(raw, task)}"
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
