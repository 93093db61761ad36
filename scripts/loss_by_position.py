"""Print how much worse each run's test loss is at each range of window positions than at its training
length: one row per run, NLL at train_len, then the excess at each position bin of one evaluation length.

    python scripts/loss_by_position.py docs/results/runs/lengths/encoding=rope,* --eval-len 2048

Reads each run's per_position.csv (non-overlapping test windows; the model as trained, or with
``--variant``, e.g. ``window{train_len}`` for each run's own window). A cell is the token-weighted mean NLL
of the positions in [a, b) of the eval_len windows minus the run's mean NLL over the whole windows of
train_len as trained, in nats. Runs at one eval_len score the same tokens at each position, so
their cells compare directly; positions past train_len are ones a run never trained on. Rows are in
order of encoding, train_len and seed.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import pandas as pd

from posbench.markdown import markdown_table
from posbench.report.tables import signed
from posbench.runfolder import PER_POSITION, require


def weighted_nll(rows: pd.DataFrame) -> float:
    return float((rows.nll * rows["count"]).sum() / rows["count"].sum()) if len(rows) else float("nan")


def scored_rows(run: Path) -> pd.DataFrame:
    """The run's per-position NLL on the test split, non-overlapping, its variant labels as text ('' as trained)."""
    table = pd.read_csv(require(run, PER_POSITION), dtype={"variant": str})  # .csv or the archive's .csv.gz
    table["variant"] = table.variant.fillna("")
    return table[(table.split == "test") & (table.eval_mode == "nonoverlapping")]


def row(run: Path, eval_len: int, edges: list[int], variant: str) -> tuple[tuple[str, int, int], list]:
    """The run's (encoding, train_len, seed), to order the rows by, and its cells."""
    table = scored_rows(run)
    train_len = int(table.train_len.iloc[0])
    base = weighted_nll(table[(table.eval_len == train_len) & (table.variant == "")])  # as trained
    at = table[(table.eval_len == eval_len) & (table.variant == variant.replace("{train_len}", str(train_len)))]
    excess = [weighted_nll(at[(at.position >= a) & (at.position < b)]) - base for a, b in zip(edges, edges[1:])]
    cells = ["" if pd.isna(e) else signed(e, 3) for e in excess]  # no rows at eval_len: blank
    encoding, seed = table.encoding.iloc[0], int(table.seed.iloc[0])
    return (encoding, train_len, seed), [encoding, f"{train_len:,}", seed, f"{base:.3f}", *cells]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (each with per_position.csv)")
    parser.add_argument("--eval-len", type=int, required=True, help="the evaluation length whose windows to read")
    parser.add_argument("--variant", default="", help="an evaluation-time variant, e.g. 'window{train_len}'")
    parser.add_argument("--edges", help="comma-separated bin edges (default: 0, 64, 128, ... doubling to eval_len)")
    args = parser.parse_args()
    doubling = [0, *(2**k for k in range(6, args.eval_len.bit_length()) if 2**k < args.eval_len), args.eval_len]
    edges = [int(e) for e in args.edges.split(",")] if args.edges else doubling
    bins = [f"{a:,}–{b - 1:,}" for a, b in zip(edges, edges[1:])]
    heading = ["encoding", "train_len", "seed", "NLL at train_len", *bins]
    try:
        rows = sorted((row(run, args.eval_len, edges, args.variant) for run in args.runs), key=lambda r: r[0])
    except (OSError, KeyError, ValueError, IndexError) as error:  # not a run folder, or one without the rows
        parser.error(str(error))
    if hasattr(signal, "SIGPIPE"):  # `| head` ends the script quietly, as it ends cat
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    print(markdown_table(heading, [cells for _, cells in rows]))


if __name__ == "__main__":
    main()
