"""Experiment logging: ``logger=csv`` (the default) or ``logger=tensorboard``.

Every run writes ``train_log.csv`` and ``results.csv`` whatever the logger; ``tensorboard``
also writes event files into the run folder (``tensorboard --logdir outputs/``): training
and validation loss, learning rate and tokens/s by step, and the final perplexity against
evaluation length (one curve per split, x = eval_len) with the table as text.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .errors import PosbenchError
from .markdown import markdown_table

LOGGERS = ("csv", "tensorboard")


def check_logger(name: str) -> None:
    if name not in LOGGERS:
        raise PosbenchError(f"logger must be one of {', '.join(LOGGERS)}; got {name!r}")


def ppl_table(results: pd.DataFrame) -> str:
    """Perplexity by eval_len (rows) and split (columns) as a Markdown table; unsupported lengths are blank."""
    table = results.pivot_table(index="eval_len", columns="split", values="ppl", sort=True)
    table = table.reindex(index=sorted(results["eval_len"].unique()), columns=list(dict.fromkeys(results["split"])))
    rows = ([eval_len, *("" if math.isnan(v) else f"{v:.2f}" for v in row)] for eval_len, row in table.iterrows())
    return markdown_table(["eval_len", *table.columns], rows)


class Logger:
    """``logger=csv``: nothing beyond the CSV files the run writes in any case."""

    def log_step(self, row: dict) -> None:
        """One ``train_log.csv`` row: step, train_loss, lr, tokens_per_s, valid_loss (None when not measured)."""

    def log_results(self, results: pd.DataFrame) -> None:
        """The final ``results.csv`` rows."""

    def close(self) -> None:
        pass


class TensorBoardLogger(Logger):
    #: train_log.csv column -> TensorBoard tag
    SCALARS = {"train_loss": "loss/train", "valid_loss": "loss/valid", "lr": "lr", "tokens_per_s": "tokens_per_s"}

    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise PosbenchError(
                "logger=tensorboard needs the tensorboard package: pip install 'posbench[tensorboard]'"
            ) from None
        self.writer = SummaryWriter(log_dir=str(run_dir))

    def log_step(self, row: dict) -> None:
        for column, tag in self.SCALARS.items():
            value = row.get(column)
            if value is not None and not math.isnan(value):
                self.writer.add_scalar(tag, value, row["step"])

    def log_results(self, results: pd.DataFrame) -> None:
        for r in results[results["status"] == "ok"].itertuples():
            self.writer.add_scalar(f"ppl_vs_length/{r.split}", r.ppl, r.eval_len)
        self.writer.add_text("ppl_vs_length", ppl_table(results))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_logger(name: str, run_dir: Path, is_main: bool = True) -> Logger:
    """The logger ``name`` writing into ``run_dir``; a silent one on ranks other than 0."""
    check_logger(name)
    return TensorBoardLogger(run_dir) if name == "tensorboard" and is_main else Logger()
