"""Print one statistic of each run's attention anatomy at every length the probe read: one row per run,
one column per eval_len, so that runs of different training lengths compare at the same number of tokens.

    python scripts/attention_by_length.py docs/results/runs/lengths/encoding=rope,* --stat mean_distance

Reads each run's attention_stats.csv (the attention probe: one window of the stream's first eval_len test
tokens at 1, 4 and 16 × train_len) for the model as trained. A cell is the mean over layers and heads of
``entropy`` (nats), ``mean_distance`` (tokens) or ``mass_beyond_train_len`` (the share of attention on keys
more than train_len back; blank at train_len); blank where the run has no such length. Rows are in order
of encoding, variant, train_len and seed.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import pandas as pd

from posbench.markdown import markdown_table
from posbench.report.probes import as_trained
from posbench.runfolder import ATTENTION_CSV, require

STATS = {"entropy": 3, "mean_distance": 1, "mass_beyond_train_len": 3}  # digits of a cell


def run_means(run: Path, stat: str) -> tuple[tuple[str, str, int, int], pd.Series]:
    """The run's (encoding, variant, train_len, seed) and its mean ``stat`` per eval_len (probed lengths only)."""
    table = as_trained(pd.read_csv(require(run, ATTENTION_CSV)))  # .csv or the archive's .csv.gz
    table = table[table.status == "ok"]
    first = table.iloc[0]
    identity = (first.encoding, first.variant, int(first.train_len), int(first.seed))
    return identity, table.groupby("eval_len")[stat].mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (each with attention_stats.csv)")
    parser.add_argument("--stat", choices=list(STATS), default="mean_distance", help="the statistic to print")
    args = parser.parse_args()
    try:
        runs = sorted((run_means(run, args.stat) for run in args.runs), key=lambda run: run[0])
    except (OSError, KeyError, ValueError, IndexError, AttributeError) as error:  # not a run folder, or no rows
        parser.error(str(error))
    lengths = sorted({int(n) for _, means in runs for n in means.index})
    rows = []
    for (encoding, variant, train_len, seed), means in runs:
        cells = ["" if pd.isna(means.get(n)) else f"{means[n]:,.{STATS[args.stat]}f}" for n in lengths]
        rows.append([encoding, variant, f"{train_len:,}", seed, *cells])
    if hasattr(signal, "SIGPIPE"):  # `| head` ends the script quietly, as it ends cat
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    numeric = ["train_len", "seed", *(f"{n:,}" for n in lengths)]
    print(markdown_table(["encoding", "variant", *numeric], rows, right=numeric))


if __name__ == "__main__":
    main()
