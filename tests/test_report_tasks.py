"""The report's task section: task_results.csv collected, averaged over the seeds that learned, the others named."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from posbench.errors import PosbenchError
from posbench.report import report
from posbench.report.selection import Selection
from posbench.report.tasks import collect_tasks, learning_curves, task_heatmaps
from posbench.runfolder import TASK_RESULTS, TRAIN_LOG, ModelState, merge_rows


def task_run(folder, encoding: str, seed: int, accuracies: dict, status: str = "ok", variant: str = ""):
    """A finished task run's task_results.csv: ``accuracies`` by (eval_len, distance) (rows of ``variant``
    merge into a folder that holds the run)."""
    rows = pd.DataFrame(
        [
            dict(encoding=encoding, variant=variant, task="passkey", train_len=64, train_lengths="64", seed=seed)
            | dict(eval_len=length, distance=distance, trials=64, accuracy=accuracy, token_accuracy=accuracy, nll=0.1)
            | dict(status=status, reason="" if status == "ok" else "accuracy 0.2 at train_len 64: not learned")
            | dict(valid_accuracy=1.0 if status == "ok" else 0.2, learned_step=300 if status == "ok" else None)
            | dict(best_step=400, stopped_step=500)
            for (length, distance), accuracy in accuracies.items()
        ]
    )
    folder.mkdir(parents=True, exist_ok=True)
    merge_rows(folder, TASK_RESULTS, rows, ModelState(f"{encoding}{seed}", 100, True))


def test_learning_curves_come_from_each_runs_train_log_with_its_identity(tmp_path):
    grid = {(64, 0): 1.0, (128, 0): 0.5}
    task_run(tmp_path / "a0", "alibi", 0, grid)
    task_run(tmp_path / "r1", "rope", 1, grid, status="not_learned")
    task_run(tmp_path / "n0", "none", 0, grid)  # no train_log.csv: no curve, and no failure
    for name, accuracies in (("a0", [0.5, 0.97]), ("r1", [0.1, 0.2])):
        pd.DataFrame(
            dict(step=[100, 150, 200], train_loss=[1.0, 0.5, 0.2], valid_loss=[1.0, None, 0.5])
            | dict(valid_accuracy=[accuracies[0], None, accuracies[1]])  # logged at validations only
        ).to_csv(tmp_path / name / TRAIN_LOG, index=False)
    curves = learning_curves(collect_tasks(tmp_path)[0]).set_index(["encoding", "step"])
    assert sorted(curves.index) == [("alibi", 100), ("alibi", 200), ("rope", 100), ("rope", 200)]
    assert curves.loc[("alibi", 200), "valid_accuracy"] == 0.97 and curves.loc[("rope", 100), "valid_accuracy"] == 0.1
    assert curves.loc[("alibi", 100), "learned"] and not curves.loc[("rope", 200), "learned"]
    assert curves.loc[("rope", 200), "seed"] == 1 and curves.loc[("rope", 200), "task"] == "passkey"
    out = report(tmp_path)
    assert (out / "task_passkey_learning.png").is_file() and (out / "task_passkey_learning.svg").is_file()


def test_task_runs_alone_make_a_table_and_a_figure_per_task(tmp_path):
    grid = {(64, 0): 1.0, (64, 55): 0.96, (128, 0): 0.5, (128, 119): 0.25}
    task_run(tmp_path / "a0", "alibi", 0, grid)
    task_run(tmp_path / "a1", "alibi", 1, {k: v / 2 for k, v in grid.items()})
    task_run(tmp_path / "a2", "alibi", 2, grid, status="not_learned")  # left out of the mean, counted
    task_run(tmp_path / "r0", "rope", 0, grid, status="not_learned")
    out = report(tmp_path)
    summary = pd.read_csv(out / "task_summary.csv").set_index(["encoding", "eval_len", "distance"])
    assert summary.loc[("alibi", 128, 0), "accuracy_mean"] == 0.375  # (0.5 + 0.25) / 2: seeds 0 and 1
    assert summary.loc[("alibi", 128, 0), "seeds"] == 2 and summary.loc[("alibi", 128, 0), "not_learned"] == 1
    text = (out / "summary.md").read_text()
    assert "## Task passkey" in text and "| alibi |  | 64 | 128 | 0.38 ± 0.18 (1 not learned) |" in text
    assert "| rope |  | 64 | 64 | not learned |" in text
    assert "| alibi |  | 64 | 64 | 2 of 3 | 0.733 | 300 | 400 | 500 |" in text  # learned_step: of the learned
    assert "| rope |  | 64 | 64 | 0 of 1 | 0.200 |  | 400 | 500 |" in text
    assert (out / "task_passkey.png").is_file() and (out / "task_passkey.svg").is_file()
    assert (out / "task_passkey_heatmap.png").is_file() and (out / "task_passkey_heatmap.svg").is_file()
    assert len(pd.read_csv(out / "task_results.csv")) == 16


def summary_row(encoding, length, distance, accuracy=float("nan"), seeds=1, not_learned=0, unsupported=0):
    """A row of task_summary: one line's accuracy at (eval_len, distance)."""
    line = dict(task="passkey", encoding=encoding, variant="", train_len=64, train_lengths="64")
    return (
        line
        | dict(eval_len=length, distance=distance, accuracy_mean=accuracy, accuracy_std=0.0, seeds=seeds)
        | dict(not_learned=not_learned, unsupported=unsupported)
    )


def test_heat_maps_hold_accuracy_by_distance_row_and_eval_len_with_the_longest_last():
    summary = pd.DataFrame(
        [
            summary_row("alibi", 64, 0, 1.0),
            summary_row("alibi", 64, 55, 0.9),  # longest at 64
            summary_row("alibi", 128, 0, 0.5),
            summary_row("alibi", 128, 64, 0.7),  # at 128 alone, but not its longest: a row of its own
            summary_row("alibi", 128, 119, 0.25),  # longest at 128
            summary_row("learned", 64, 0, 1.0),
            summary_row("learned", 64, 55, 0.8),
            summary_row("learned", 256, 0, seeds=0, unsupported=1),
            summary_row("learned", 256, 247, seeds=0, unsupported=1),
            *(summary_row("rope", n, d, seeds=0, not_learned=2) for n, d in [(64, 0), (64, 55), (128, 0), (128, 119)]),
        ]
    )
    alibi, learned, rope = task_heatmaps(summary)
    assert [m.name for m in (alibi, learned, rope)] == ["alibi", "learned", "rope"]
    for heatmap in (alibi, learned, rope):
        assert list(heatmap.accuracy.index) == [0, 64, math.inf] and list(heatmap.accuracy.columns) == [64, 128, 256]
    nan = float("nan")
    expected = [[1.0, 0.5, nan], [nan, 0.7, nan], [0.9, 0.25, nan]]
    np.testing.assert_array_equal(alibi.accuracy.to_numpy(), expected)
    assert alibi.learned and not alibi.unsupported.to_numpy().any()
    np.testing.assert_array_equal(learned.accuracy.to_numpy(), [[1.0, nan, nan], [nan, nan, nan], [0.8, nan, nan]])
    assert learned.unsupported.to_numpy().tolist() == [
        [False, False, True],
        [False, False, False],
        [False, False, True],
    ]
    assert learned.learned and not rope.learned and rope.accuracy.isna().all().all()


def test_variants_select_the_task_rows_too(tmp_path):
    grid = {(64, 0): 1.0, (128, 0): 0.5}
    task_run(tmp_path / "r0", "rope", 0, grid)
    task_run(tmp_path / "r0", "rope", 0, {k: v / 4 for k, v in grid.items()}, variant="yarn×4")
    as_trained = pd.read_csv(report(tmp_path, selection=Selection(variants=())) / "task_results.csv", dtype=str)
    assert set(as_trained["variant"].fillna("")) == {""} and len(as_trained) == 2
    both = pd.read_csv(report(tmp_path, selection=Selection(variants=("yarn×4",))) / "task_results.csv", dtype=str)
    assert set(both["variant"].fillna("")) == {"", "yarn×4"} and len(both) == 4
    with pytest.raises(PosbenchError, match="variants=yarn×8: no run has it; the runs' variants: yarn×4"):
        report(tmp_path, selection=Selection(variants=("yarn×8",)))
