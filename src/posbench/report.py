"""``posbench report DIR``: tables and figures from the results.csv files of every run below DIR.

Reads CSVs only, never trains. Writes DIR/report/{results.csv, summary.md, ppl_vs_length.png}.
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .errors import PosbenchError  # noqa: E402
from .io import atomic_write, write_csv, write_text  # noqa: E402

log = logging.getLogger(__name__)

REPORT_DIR = "report"


def collect_results(root: Path) -> pd.DataFrame:
    """Concatenate every run's results.csv below ``root`` (the report folder excluded)."""
    frames = []
    for path in sorted(root.rglob("results.csv")):
        if REPORT_DIR in path.relative_to(root).parts[:-1]:
            continue
        try:
            frames.append(pd.read_csv(path))
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            log.warning("skipping %s: unreadable (%s)", path, e)
    if not frames:
        raise PosbenchError(f"no runs found under {root} (no results.csv)")
    return pd.concat(frames, ignore_index=True)


def summary_table(results: pd.DataFrame, split: str) -> pd.DataFrame:
    """Perplexity per (encoding, train_len) x eval_len, with the change relative to eval_len = train_len."""
    df = results[results["split"] == split]
    ppl = df.pivot_table(index=["encoding", "train_len"], columns="eval_len", values="ppl", aggfunc="mean")
    status = df.pivot_table(index=["encoding", "train_len"], columns="eval_len", values="status", aggfunc="first")
    cells = pd.DataFrame(index=ppl.index, columns=ppl.columns, dtype=object)
    for (encoding, train_len), row in ppl.iterrows():
        base = row.get(train_len)
        for eval_len, value in row.items():
            if pd.isna(value):
                cells.loc[(encoding, train_len), eval_len] = status.loc[(encoding, train_len), eval_len] if (encoding, train_len) in status.index else ""
            elif pd.isna(base) or eval_len == train_len:
                cells.loc[(encoding, train_len), eval_len] = f"{value:.1f}"
            else:
                cells.loc[(encoding, train_len), eval_len] = f"{value:.1f} ({100 * (value / base - 1):+.1f}%)"
    return cells.fillna("")


def to_markdown(table: pd.DataFrame) -> str:
    header = [*table.index.names, *(str(c) for c in table.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in table.iterrows():
        lines.append("| " + " | ".join([*(str(i) for i in index), *(str(v) for v in row)]) + " |")
    return "\n".join(lines)


def plot_ppl_vs_length(results: pd.DataFrame, split: str, path: Path) -> None:
    df = results[(results["split"] == split) & (results["status"] == "ok")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (encoding, train_len), group in df.groupby(["encoding", "train_len"]):
        curve = group.groupby("eval_len")["ppl"].mean()
        ax.plot(curve.index, curve.values, marker="o", label=f"{encoding} (train {train_len})")
    for train_len in sorted(df["train_len"].unique()):
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(f"{split} perplexity")
    ax.set_title("Perplexity vs evaluation length (dotted: training length)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format=path.suffix[1:]))
    plt.close(fig)


def report(root: Path) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise PosbenchError(f"{root} is not a folder")
    results = collect_results(root)
    out = root / REPORT_DIR
    write_csv(results, out / "results.csv")
    splits = [s for s in ("test", "valid") if s in set(results["split"])]
    sections = [f"# posbench report\n\n{results['run_dir'].nunique()} runs under `{root}`."]
    for split in splits:
        sections.append(
            f"## {split} perplexity\n\nNon-overlapping windows; in brackets the change relative to "
            f"the training length.\n\n{to_markdown(summary_table(results, split))}"
        )
    write_text("\n\n".join(sections) + "\n", out / "summary.md")
    plot_ppl_vs_length(results, splits[0], out / "ppl_vs_length.png")
    return out
