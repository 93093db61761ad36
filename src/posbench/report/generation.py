"""Generation in the report: generation.csv of every finished run below DIR (docs/generation.md).

``collect_generation`` reads the rows and ``with_models`` names the model that drew them; ``generation_summary``
averages each window's repetition, distinct-2 and self-NLL over the prompts and seeds of a line, against
position / train_len; ``generation_markdown`` writes where samples degenerated (``onset_table``) and the measures
at multiples of train_len as summary.md sections; ``draw_generation_figure`` draws the figure ``generation``: the
three measures against position / train_len, a line per model (encoding, variant, and where set its training
lengths and config label).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..markdown import markdown_table
from ..runfolder import GENERATION
from .collect import Run, collect_finished_rows, lengths_text
from .figures import line_styles, plain_ticks, save_figure
from .tables import at_train_len_alone, label

#: What one line of the generation table and figure is: a model as trained (told apart as the text tables tell
#: models apart: training lengths, config label) and evaluated, and how it sampled.
GENERATION_LINE = ["encoding", "variant", "train_len", "train_lengths", "config", "temperature", "top_k", "top_p"]
#: A line of the figure: the model (its samples at every train_len and sampling setting pooled).
FIGURE_LINE = ["encoding", "variant", "train_lengths", "config"]
#: One sample: its run and prompt (the onset is repeated on each of its windows' rows).
SAMPLE = ["run_id", "variant", "precision", "seed", "temperature", "top_k", "top_p", "source", "prompt_id"]
MEASURES = {"repetition": "repeated 4-grams (share)", "distinct_2": "distinct-2", "nll": "self-NLL (nats)"}
#: Multiples of train_len at which summary.md shows the measures.
SHOWN_MULTIPLES = (1, 2, 4, 8, 16)


def collect_generation(root: Path) -> tuple[pd.DataFrame, dict[Path, str]]:
    """Every finished run's generation.csv rows below ``root``, and what was left out of which folder."""
    return collect_finished_rows(root, GENERATION)


def with_models(rows: pd.DataFrame, runs: list[Run]) -> pd.DataFrame:
    """``rows`` with the training lengths and config label of the run whose model drew them, so that samples of
    models trained apart are not pooled as seeds (a model not among ``runs``: its train_len, no label)."""
    if rows.empty:
        return rows
    models = {run.run_id: (run.train_lengths, run.config) for run in runs}
    model = [models.get(r, (lengths_text(t), "")) for r, t in zip(rows["run_id"], rows["train_len"])]
    return rows.assign(train_lengths=[m[0] for m in model], config=[m[1] for m in model])


def shown_line(rows: pd.DataFrame) -> list[str]:
    """The GENERATION_LINE columns summary.md shows: training lengths and config only where some line sets them."""
    hidden = {"config"} if not rows["config"].astype(bool).any() else set()
    if at_train_len_alone(rows).all():
        hidden.add("train_lengths")
    return [c for c in GENERATION_LINE if c not in hidden]


def generation_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (line, window): ``at`` (the window's first position / train_len) and each measure's mean and
    std over the samples that reached the window, ``samples`` of them."""
    at = rows.assign(at=rows["position"] / rows["train_len"])
    grouped = at.groupby([*GENERATION_LINE, "at"], dropna=False)
    summary = grouped.agg(
        samples=("prompt_id", "size"), **{f"{m}_{stat}": (m, stat) for m in MEASURES for stat in ("mean", "std")}
    )
    return summary.reset_index()


def onset_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per line: samples, how many degenerated, and the first and median onset / train_len among those that did."""
    samples = rows.drop_duplicates(SAMPLE).assign(onset=lambda d: d["degeneration_onset"] / d["train_len"])
    table = samples.groupby(GENERATION_LINE, dropna=False).agg(
        samples=("prompt_id", "size"),
        degenerated=("onset", "count"),
        first_onset=("onset", "min"),
        median_onset=("onset", "median"),
        longest=("position", "max"),
    )
    return table.reset_index()


def at_multiple(rows: pd.DataFrame, measure: str, multiple: int) -> pd.Series:
    """Per line, the measure's mean over the windows that hold position multiple × train_len − 1 (absent: none did)."""
    end = rows["train_len"] * multiple
    holding = rows[(rows["position"] < end) & (rows["position"] + rows["tokens"] >= end)]
    return holding.groupby(GENERATION_LINE, dropna=False)[measure].mean()


def generation_markdown(rows: pd.DataFrame) -> list[str]:
    """summary.md's sections: where samples degenerated, and the measures at 1, 2, 4, 8, 16 × train_len."""
    onsets, columns = onset_table(rows), shown_line(rows)
    onset_rows = []
    for _, line in onsets.iterrows():
        shown = [f"{line[c]:.2f}×" if pd.notna(line[c]) else "" for c in ("first_onset", "median_onset")]
        onset_rows.append([*(line[c] for c in columns), f"{line['degenerated']} of {line['samples']}", *shown])
    header = [*columns, "degenerated", "first onset", "median onset"]
    sections = [
        "## Generation: degeneration onset\n\nSamples whose rolling share of repeated 4-grams stays at or above "
        "the threshold for a whole window (generate.repetition_threshold), and where that began, as a multiple "
        f"of train_len.\n\n{markdown_table(header, onset_rows)}"
    ]
    for measure, name in MEASURES.items():
        values = pd.DataFrame({f"{k}×": at_multiple(rows, measure, k) for k in SHOWN_MULTIPLES})
        table = [
            [
                *(k for k, c in zip(key, GENERATION_LINE) if c in columns),
                *(f"{v:.3f}" if pd.notna(v) else "" for v in cells),
            ]
            for key, cells in values.iterrows()
        ]
        sections.append(
            f"### Generation: {name} by position\n\nMean over samples of the window that holds position k × "
            f"train_len.\n\n{markdown_table([*columns, *values.columns], table)}"
        )
    return sections


def octave_bins(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's windows pooled by half-octave of position / train_len (a window's mean weighted by its samples),
    so that a line shows the trend, not the noise of 64-token windows; ``at``: the bin's geometric middle."""
    binned = summary.assign(bin=np.floor(np.log2(summary["at"]) * 2) / 2)
    weights, keys = binned["samples"], [binned[c] for c in [*FIGURE_LINE, "bin"]]
    pooled = {m: (binned[f"{m}_mean"] * weights).groupby(keys).sum() / weights.groupby(keys).sum() for m in MEASURES}
    table = pd.DataFrame(pooled).reset_index()
    return table.assign(at=2 ** (table["bin"] + 0.25))


def draw_generation_figure(summary: pd.DataFrame, colours: dict[str, str], out: Path) -> None:
    """generation.png/.svg: each measure against position / train_len (``octave_bins``), a line per model
    (FIGURE_LINE)."""
    lines = list(summary.groupby(FIGURE_LINE).groups)
    summary = octave_bins(summary)
    styles = line_styles(lines, colours)
    fig = Figure(figsize=(4.5 * len(MEASURES), 3.6))
    axes = fig.subplots(1, len(MEASURES))
    for ax, (measure, name) in zip(axes, MEASURES.items()):
        for line, group in summary.groupby(FIGURE_LINE):
            encoding, variant, lengths, config = line
            named = label(encoding, variant, config=config) + (f" (train {lengths})" if "|" in lengths else "")
            group = group.sort_values("at")
            ax.plot(group["at"], group[measure], marker="o", markersize=3, label=named, **styles[line])
        ax.set_xscale("log", base=2)
        ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set(title=name, xlabel="position / train_len")
        plain_ticks(ax)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False)
    fig.suptitle("Generated text past the training length (dotted: train_len; mean over samples, per half-octave)")
    fig.tight_layout()
    save_figure(fig, out / "generation.png")
