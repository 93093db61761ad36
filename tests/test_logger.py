"""logger=csv|tensorboard: what lands in the TensorBoard event files, read back with TensorBoard's own reader."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from posbench.errors import PosbenchError
from posbench.logger import Logger, open_logger, ppl_table

RESULTS = pd.DataFrame(
    [
        dict(split="valid", eval_len=32, ppl=120.5, status="ok"),
        dict(split="valid", eval_len=64, ppl=150.25, status="ok"),
        dict(split="test", eval_len=32, ppl=130.0, status="ok"),
        dict(split="test", eval_len=64, ppl=float("nan"), status="unsupported"),
    ]
)


def read_events(run_dir):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def scalars(events, tag) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_logs_losses_lr_throughput_and_ppl_vs_length(tmp_path):
    pytest.importorskip("tensorboard")
    logger = open_logger("tensorboard", tmp_path)
    logger.log_step(dict(step=1, train_loss=7.5, lr=1e-3, tokens_per_s=1000.0, valid_loss=None))
    logger.log_step(dict(step=2, train_loss=6.25, lr=5e-4, tokens_per_s=1200.0, valid_loss=6.5))
    logger.log_results(RESULTS)
    logger.close()

    events = read_events(tmp_path)
    assert scalars(events, "loss/train") == [(1, 7.5), (2, 6.25)]
    assert scalars(events, "loss/valid") == [(2, 6.5)]  # only where measured
    assert [s for s, _ in scalars(events, "lr")] == [1, 2]
    assert [v for _, v in scalars(events, "lr")] == pytest.approx([1e-3, 5e-4])
    assert scalars(events, "tokens_per_s") == [(1, 1000.0), (2, 1200.0)]
    assert scalars(events, "ppl_vs_length/valid") == [(32, 120.5), (64, 150.25)]
    assert scalars(events, "ppl_vs_length/test") == [(32, 130.0)]  # the unsupported length is left out
    assert "ppl_vs_length/text_summary" in events.Tags()["tensors"]


def test_ppl_table_rows_are_lengths_and_columns_splits():
    assert ppl_table(RESULTS).splitlines() == [
        "| eval_len | valid | test |",
        "|---|---|---|",
        "| 32 | 120.50 | 130.00 |",
        "| 64 | 150.25 |  |",
    ]


def test_csv_logger_and_other_ranks_write_nothing(tmp_path):
    assert type(open_logger("csv", tmp_path)) is Logger
    assert type(open_logger("tensorboard", tmp_path, is_main=False)) is Logger
    open_logger("csv", tmp_path).log_step(dict(step=1, train_loss=1.0))
    assert list(tmp_path.iterdir()) == []


def test_unknown_logger_is_one_line_error(tmp_path):
    with pytest.raises(PosbenchError, match="logger must be one of csv, tensorboard; got 'wandb'"):
        open_logger("wandb", tmp_path)


def test_nan_losses_are_skipped(tmp_path):
    pytest.importorskip("tensorboard")
    logger = open_logger("tensorboard", tmp_path)
    logger.log_step(dict(step=3, train_loss=math.nan, lr=1e-3, tokens_per_s=10.0))
    logger.close()
    assert "loss/train" not in read_events(tmp_path).Tags()["scalars"]
