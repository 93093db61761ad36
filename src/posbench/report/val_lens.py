"""The curves of ``train.val_lens`` for the report: validation loss at each length against the training step, per
line (encoding, variant, train_len), from train_log.csv's ``valid_loss_L`` columns; ``figures`` draws them
(val_lens_curves.png) where some run logged them. They show whether extrapolation improves, holds or gets worse
as training goes on."""

from __future__ import annotations

import re

import pandas as pd

from .collect import Run
from .tables import LINE, run_curve


def val_lens_curves(runs: list[Run]) -> pd.DataFrame:
    """Validation loss by step at every length a run logged (its ``valid_loss_L`` columns and train_len's
    ``valid_loss``): columns LINE, length, step, loss, the mean over the seeds of a line. Empty if no run
    logged train.val_lens."""
    frames = []
    for run in runs:
        curve = run_curve(run)
        if curve is None:
            continue
        lengths = {c: int(c.removeprefix("valid_loss_")) for c in curve if re.fullmatch(r"valid_loss_\d+", c)}
        if not lengths:
            continue
        train_len = int(curve["train_len"].iloc[0])
        if train_len not in lengths.values():
            lengths["valid_loss"] = train_len
        long = curve.melt(id_vars=[*LINE, "step"], value_vars=list(lengths), var_name="column", value_name="loss")
        frames.append(long.assign(length=long["column"].map(lengths)))
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames).groupby([*LINE, "length", "step"], as_index=False)["loss"].mean()
