"""Print a table of docs/results.md from a report folder: one row per model, its stopping steps, its test
perplexity at train_len, the change at each longer length, and its probe numbers.

    python scripts/results_table.py docs/results/runs/lengths/report --multiples
    python scripts/results_table.py outputs/study/report --encodings alibi,rope --window 8192
    python scripts/results_table.py docs/results/runs/seed0/report --variants --encodings rope
    python scripts/results_table.py docs/results/runs/copylm0/report --copy

Reads the report's results.csv, summary.csv and probes.csv (what ``posbench report`` writes), so every
number in the table can be traced to the runs' CSVs. Rows are the non-overlapping test evaluation of
each model as trained (variants that change the evaluation, such as windows, are left out; ``--window``
adds a column for the window of train_len keys). ``--variants`` prints instead one row per evaluation of
each model: as trained and each evaluation-time variant (scaling, log-n, temperature, window), under each
evaluation mode, with the test tokens scored. ``--copy`` prints instead the copy probe: per model, the
accuracy of the copied spans at each distance (mean ± std over seeds) and each seed's copy_reach. Cells:
mean over seeds, with the sample standard deviation at train_len and at the longest length when there are
several; changes are of the mean.
"""

from __future__ import annotations

import argparse
import re
import signal
from pathlib import Path

import pandas as pd

from posbench.evaluate import variant_parts
from posbench.markdown import markdown_table
from posbench.report.probes import largest_vocab
from posbench.report.tables import change, mean_std, signed
from posbench.runfolder import COPY_CSV

MODEL = ["encoding", "variant", "train_len", "train_lengths"]
COPY_MULTIPLES = [2, 4, 8, 16, 32]  # the copy table's distances past train_len, as multiples of it


PROBES = {  # probes.csv column: (heading, the cell made from its values over seeds)
    "gain_beyond": ("gain_beyond (nats)", lambda values: signed(values.mean(), 3)),
    "effective_context": ("effective context", lambda values: ", ".join(f"{v:,.0f}" for v in sorted(values.unique()))),
    "window_gap": ("window gap at 16× (nats)", lambda values: signed(values.mean(), 3)),
    "mass_beyond": ("attention beyond train_len at 16×", lambda values: f"{values.mean():.2f}"),
}


def steps(results: pd.DataFrame) -> str:
    """Where each seed's run stopped and its best step: '1,600 / 1,100', seeds joined by '; '."""
    runs = results.drop_duplicates("run_dir").sort_values("seed")
    return "; ".join(f"{r.stopped_step:,.0f} / {r.best_step:,.0f}" for r in runs.itertuples())


def ppl_cells(summary: pd.DataFrame, train_len: int, columns: list[int], multiples: bool) -> list[str]:
    """The mean at train_len (± std), then each column's mean and its change against train_len."""
    by_len = summary.set_index("eval_len")
    if train_len not in by_len.index:
        return [""] * (len(columns) + 1)
    base = by_len.loc[train_len]
    cells = [mean_std(base.ppl_mean, base.ppl_std)]
    for column in columns:
        eval_len = train_len * column if multiples else column
        if eval_len not in by_len.index or eval_len <= train_len:
            cells.append("")
            continue
        point = by_len.loc[eval_len]
        if pd.isna(point.ppl_mean):  # e.g. learned positions past their table: the status says why
            cells.append(point.status)
            continue
        std = point.ppl_std if eval_len == by_len.index.max() else float("nan")  # keeps the row readable
        cells.append(mean_std(point.ppl_mean, std) + change(point.ppl_mean, base.ppl_mean))
    return cells


def probe_cells(probes: pd.DataFrame) -> list[str]:
    cells = []
    for column, (_, cell) in PROBES.items():
        values = probes[column].dropna() if column in probes else pd.Series(dtype=float)
        cells.append("" if values.empty else cell(values))
    return cells


def read(path: Path) -> pd.DataFrame:
    """A report CSV, its label columns as text ('' where empty) so that rows group and match on them."""
    labels = ["variant", "train_lengths"]
    table = pd.read_csv(path, dtype=dict.fromkeys(labels, str))
    table[labels] = table[labels].fillna("")
    return table


def read_report(report: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The report's summary and results rows of the test split, each with its model's trained and
    evaluated-as parts of the variant (``variant_parts``)."""
    summary, results = read(report / "summary.csv"), read(report / "results.csv")
    for rows in summary, results:
        parts = rows.variant.map(variant_parts)
        rows["trained"], rows["evaluated_as"] = parts.str[0], parts.str[1]
    return summary[summary.split == "test"], results[results.split == "test"]


def length_columns(summary: pd.DataFrame, multiples: bool) -> tuple[list[int], list[str]]:
    """The lengths (or multiples of train_len) past train_len that have rows, and the headings of
    train_len's column and theirs."""
    if multiples:
        columns = sorted({int(r) for r in summary.eval_len / summary.train_len if r > 1})
        return columns, ["1×", *(f"{c}×" for c in columns)]
    columns = sorted(summary.eval_len[summary.eval_len > summary.train_len.min()].unique())
    return columns, ["at train_len", *(f"{c:,}" for c in columns)]


def table(report: Path, multiples: bool, window: int | None, encodings: list[str] | None) -> str:
    summary, results = read_report(report)
    probes = read(report / "probes.csv") if (report / "probes.csv").exists() else None
    summary = summary[summary.eval_mode == "nonoverlapping"]
    results = results[results.eval_mode == "nonoverlapping"]
    columns, length_headings = length_columns(summary, multiples)
    models = summary[summary.evaluated_as == ""]  # as trained: no evaluation-time variant (window, scaling, ...)
    mixed = (models.train_lengths != models.train_len.astype(str)).any()
    heading = ["encoding", "variant", *(["trained at"] if mixed else []), "train_len", "stopped / best step"]
    heading += length_headings
    heading += [f"window of train_len keys, at {window:,}{'×' if multiples else ''}"] if window else []
    heading += [name for name, _ in PROBES.values()] if probes is not None else []
    lines = []
    for key, rows in models.groupby(MODEL, sort=True):
        encoding, variant, train_len, train_lengths = key
        if encodings and encoding not in encodings:
            continue
        cells = [encoding, variant, *([train_lengths] if mixed else []), f"{train_len:,}"]
        cells += [steps(same_model(results, key)), *ppl_cells(rows, train_len, columns, multiples)]
        if window:
            label = "+".join(filter(None, [variant, f"window{train_len}"]))  # variant_of's order: trained first
            cells += ppl_cells(
                same_model(summary, (encoding, label, train_len, train_lengths)), train_len, [window], multiples
            )[1:]
        if probes is not None:
            cells += probe_cells(same_model(probes, key))
        lines.append(cells)
    return markdown_table(heading, lines)


def variants_table(report: Path, multiples: bool, encodings: list[str] | None) -> str:
    """One row per evaluation of each model (as trained, then each evaluation-time variant; under each
    evaluation mode), with the test tokens it scored at train_len."""
    summary, results = read_report(report)
    columns, length_headings = length_columns(summary, multiples)
    heading = ["encoding", "variant", "train_len", "evaluated as", "mode", "test tokens", *length_headings]
    lines = []
    evaluations = ["encoding", "trained", "train_len", "train_lengths", "evaluated_as", "eval_mode"]
    for key, rows in sorted(summary.groupby(evaluations), key=lambda group: natural(group[0])):
        encoding, trained, train_len, _, evaluated_as, mode = key
        if encodings and encoding not in encodings:
            continue
        scored = same_model(results, key, evaluations)
        tokens = scored.tokens[scored.eval_len == train_len].unique()
        cells = [encoding, trained, f"{train_len:,}", evaluated_as or "as trained", mode]
        cells += [", ".join(f"{t:,.0f}" for t in sorted(tokens)), *ppl_cells(rows, train_len, columns, multiples)]
        lines.append(cells)
    return markdown_table(heading, lines)


def copy_table(report: Path, encodings: list[str] | None) -> str:
    """One row per model that has copy probe rows: the spans' words (the largest ``probe.vocab`` where the
    model has them, as the report's copy_reach), the accuracy at d = 0, its range over the distances inside
    train_len, at each multiple of train_len back, and each seed's copy_reach (probes.csv)."""
    copies = read(report / COPY_CSV)
    probes = read(report / "probes.csv")
    heading = ["encoding", "variant", "train_len", "seeds", "spans of", "accuracy at d = 0", "0 < d < train_len"]
    heading += [*(f"d = {m}×" for m in COPY_MULTIPLES), "copy_reach (tokens), by seed"]
    lines = []
    for key, rows in copies[copies.status == "ok"].groupby(MODEL, sort=True):
        encoding, variant, train_len, _ = key
        if encodings and encoding not in encodings:
            continue
        vocab, rows = largest_vocab(rows)  # the spans the report's copy_reach reads
        by_distance = rows.groupby("distance").accuracy.agg(["mean", "std"])
        inside = by_distance["mean"][(by_distance.index > 0) & (by_distance.index < train_len)]
        cells = [encoding, variant, f"{train_len:,}", str(rows.seed.nunique())]
        cells += [f"{vocab:,.0f} words" if pd.notna(vocab) else "every word", accuracy(by_distance, 0)]
        cells += ["–".join(dict.fromkeys(f"{a:.2f}" for a in (inside.min(), inside.max()))) if len(inside) else ""]
        cells += [accuracy(by_distance, m * train_len) for m in COPY_MULTIPLES]
        reach = same_model(probes, key).sort_values("seed")[f"copy_reach{'_vocab' if pd.notna(vocab) else ''}"]
        cells.append("; ".join("no_copying" if pd.isna(r) else f"{r:,.0f}" for r in reach))
        lines.append(cells)
    return markdown_table(heading, lines)


def accuracy(by_distance: pd.DataFrame, distance: int) -> str:
    """'0.84', or '0.84 ± 0.03' over several seeds; '' where the distance was not measured."""
    if distance not in by_distance.index:
        return ""
    mean, std = by_distance.loc[distance]
    return f"{mean:.2f}" if pd.isna(std) else f"{mean:.2f} ± {std:.2f}"


def natural(key: tuple) -> list[tuple]:
    """A sort key that puts numbers in labels in their order: linear×4 before linear×16, temp1.25 before temp1.5."""
    parts = [re.split(r"(\d+(?:\.\d+)?)", str(k)) for k in key]  # text, number, text, ...
    return [tuple(float(part) if i % 2 else part for i, part in enumerate(k)) for k in parts]


def same_model(table: pd.DataFrame, key: tuple, columns: list[str] = MODEL) -> pd.DataFrame:
    """The rows of ``table`` whose ``columns`` (encoding, variant, train_len and train_lengths) are ``key``."""
    return table[(table[columns].astype(str) == pd.Series(key, index=columns).astype(str)).all(axis=1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a report folder (posbench report DIR writes DIR/report)")
    parser.add_argument("--multiples", action="store_true", help="columns at multiples of train_len")
    parser.add_argument("--encodings", help="comma-separated encodings to keep, in name order")
    layout = parser.add_mutually_exclusive_group()  # --variants has the window as a row of its own
    layout.add_argument("--window", type=int, help="add the window of train_len keys at this eval_len (or multiple)")
    layout.add_argument("--variants", action="store_true", help="a row per evaluation: variants, modes, tokens")
    layout.add_argument("--copy", action="store_true", help="the copy probe: accuracy by distance, copy_reach")
    args = parser.parse_args()
    encodings = args.encodings.split(",") if args.encodings else None
    try:
        if args.variants:
            text = variants_table(args.report, args.multiples, encodings)
        elif args.copy:
            text = copy_table(args.report, encodings)
        else:
            text = table(args.report, args.multiples, args.window, encodings)
    except (OSError, KeyError, ValueError) as error:  # not a report folder, or one without these columns
        parser.error(f"{args.report}: {error}")
    if hasattr(signal, "SIGPIPE"):  # `| head` ends the script quietly, as it ends cat
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    print(text)


if __name__ == "__main__":
    main()
