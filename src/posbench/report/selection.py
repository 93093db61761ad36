"""Which evaluations a report keeps: ``report DIR variants=... modes=...`` as a ``Selection``."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from ..config import EVAL_MODES
from ..errors import PosbenchError
from ..evaluate import variant_parts
from ..runfolder import RESULTS
from .runs import Run


@dataclass(frozen=True)
class Selection:
    """Which evaluations a report keeps (``report DIR variants=... modes=...``); None keeps every one.

    ``variants``: the evaluation-time variants kept beside the models as trained (``window256``; a
    variant's training part, ``randpos8192``, is how a model was trained and always kept). ``modes``:
    the eval modes kept (``nonoverlapping``, ``sliding``).
    """

    variants: tuple[str, ...] | None = None
    modes: tuple[str, ...] | None = None

    def __post_init__(self):
        unknown = sorted(set(self.modes or ()) - set(EVAL_MODES))
        if unknown:
            raise PosbenchError(f"modes={','.join(unknown)}: no such eval mode; the modes are {', '.join(EVAL_MODES)}")

    def __str__(self) -> str:
        chosen = (("variants", self.variants), ("modes", self.modes))
        return " ".join(f"{key}={','.join(value)}" for key, value in chosen if value is not None)

    def keep(self, table: pd.DataFrame) -> pd.Series:
        """The rows of a run's CSV that this selection keeps (every row of a table without the columns)."""
        kept = pd.Series(True, index=table.index)
        if self.variants is not None and "variant" in table:
            at_evaluation = table["variant"].astype("string").fillna("").map(lambda v: variant_parts(v)[1])
            kept &= (at_evaluation == "") | at_evaluation.isin(self.variants)
        if self.modes is not None and "eval_mode" in table:
            kept &= table["eval_mode"].isin(self.modes)
        return kept

    def apply(self, run: Run) -> Run | None:
        """``run`` with the rows this selection keeps; None where none of its results.csv rows is kept."""
        tables = {name: table[self.keep(table)].reset_index(drop=True) for name, table in run.tables.items()}
        return replace(run, tables=tables) if len(tables[RESULTS]) else None

    def rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``table`` (task or generation rows, read beside the runs) that this selection keeps."""
        return table[self.keep(table)].reset_index(drop=True)

    def check_found(self, found: set[str]) -> None:
        """Every variant named was measured somewhere (``found``: ``variants_in`` every table read): a misspelt
        one fails instead of leaving an empty line."""
        missing = sorted(set(self.variants or ()) - found)
        if missing:
            there = ", ".join(sorted(found - {""})) or "none"
            raise PosbenchError(f"variants={','.join(missing)}: no run has it; the runs' variants: {there}")


def variants_in(table: pd.DataFrame) -> set[str]:
    """The evaluation-time variants of ``table``'s rows ("" for the models as trained)."""
    column = table.get("variant", pd.Series(dtype=object)).dropna()
    return {variant_parts(str(v))[1] for v in column}


#: The selection of a report without ``variants=`` or ``modes=``: every evaluation.
KEEP_ALL = Selection()
