"""A report's runs: ``Run`` (one run's rows in one folder, by file name) and ``Runs`` (what ``collect_runs``
found, and what it left out)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..runfolder import RESULTS

#: A run's own columns that tell two runs' lines apart; a file without them gets the run's (``Runs.rows``).
RUN_IDENTITY = ("precision", "train_lengths", "config")


@dataclass(frozen=True)
class Run:
    """One run's rows in one folder, by file name (results.csv always among them), each holding its usable rows;
    ``config``: the config keys that set it apart from the other runs of its line ("" for most)."""

    folder: Path
    tables: dict[str, pd.DataFrame]
    run_id: str = ""
    config: str = ""

    @property
    def precision(self) -> str:
        """The precision the run was evaluated in ("" where results.csv does not say, or says several)."""
        values = self.tables[RESULTS].get("precision", pd.Series(dtype=object)).dropna().unique()
        return str(values[0]) if len(values) == 1 else ""

    @property
    def train_lengths(self) -> str:
        """The lengths the run trained at, ``64|128|256`` (its train_len where results.csv does not say)."""
        results = self.tables[RESULTS]
        said = results.get("train_lengths", pd.Series(dtype=object)).dropna()
        return lengths_text(said.iloc[0] if len(said) else results["train_len"].iloc[0])


def lengths_text(value) -> str:
    """A ``train_lengths`` value as written: one length that CSV reading made a number (256.0) is ``256``."""
    return str(int(value)) if isinstance(value, (int, float, np.number)) else str(value)


@dataclass(frozen=True)
class Runs:
    """What ``collect_runs`` found: the runs it reports and, per run folder, what it left out and why."""

    reported: list[Run]
    left_out: dict[Path, str]

    def rows(self, name: str) -> pd.DataFrame:
        """The rows of every reported run's ``name`` CSV, in run order (no columns where no run has one)."""
        frames = [  # probe and per-position files: the run's precision and training lengths
            table.assign(**{column: getattr(run, column) for column in RUN_IDENTITY if column not in table})
            for run in self.reported
            if name in run.tables
            for table in [run.tables[name]]
        ]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
