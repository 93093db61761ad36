"""Sweeps finish: a failed job is recorded and the others run; a re-launch retries only the failed ones."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from posbench.sweep import LAUNCH_MARK, SWEEP_LOG, data_tag, outcomes, record_job

SMOKE = ["experiment=smoke", "device=cpu", "threads=1", "eval_lens=[32]", "eval.splits=[test]"]


def test_data_tag_names_the_folder_and_hashes_the_resolved_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "data").mkdir(parents=True)
    (tmp_path / "b" / "data").mkdir(parents=True)
    tag = data_tag("a/data")
    assert tag.startswith(",data.path=data-") and len(tag.rsplit("-", 1)[1]) == 8
    assert data_tag(str(tmp_path / "a" / "data")) == tag  # relative or absolute: one folder
    assert data_tag("b/data") != tag  # same folder name, other data: another job folder
    assert data_tag(None) == data_tag("") == ""
    assert "/" not in data_tag("/some/where/with,comma=and spaces")


def test_outcomes_count_only_the_last_launch(tmp_path):
    (tmp_path / SWEEP_LOG).write_text(
        f"{LAUNCH_MARK}2026-01-01 00:00:00\n"
        "2026-01-01 00:00:01 failed encoding=rope: data folder /x does not exist\n"
        f"{LAUNCH_MARK}2026-01-01 00:01:00\n"
        "2026-01-01 00:01:01 finished encoding=alibi\n"
        "2026-01-01 00:01:02 failed encoding=none: training loss is nan at step 3\n"
    )
    finished, failed = outcomes(tmp_path)
    assert finished == 1
    assert failed == ["encoding=none: training loss is nan at step 3"]


@pytest.mark.slow
def test_a_failed_job_does_not_stop_the_sweep_and_a_relaunch_retries_only_it(tmp_path, mini_data, posbench):
    missing = tmp_path / "later"
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "train", *SMOKE, f"data.path={missing},{mini_data}", f"hydra.sweep.dir={sweep_dir}"]
    done = posbench(*args)

    assert done.returncode == 2
    assert f"sweep {sweep_dir}: 1 finished, 1 failed" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("posbench: error: 1 job(s) of the sweep failed")
    assert "Traceback" not in done.stderr
    failed = next(p for p in sweep_dir.iterdir() if p.name.endswith(data_tag(str(missing)).split("=", 1)[1]))
    finished = next(p for p in sweep_dir.iterdir() if p.name.endswith(data_tag(str(mini_data)).split("=", 1)[1]))
    assert "does not exist" in (failed / "error.txt").read_text()
    assert not (failed / "results.csv").exists()
    first_results = (finished / "results.csv").stat().st_mtime_ns

    missing.mkdir()  # fix the cause: the data arrives
    for split in ("train", "valid", "test"):
        os.symlink(mini_data / f"{split}.txt", missing / f"{split}.txt")
    again = posbench(*args)

    assert again.returncode == 0, again.stderr[-3000:]
    assert f"sweep {sweep_dir}: 2 finished, 0 failed" in again.stderr
    assert (finished / "results.csv").stat().st_mtime_ns == first_results  # finished job skipped, not rerun
    assert not (failed / "error.txt").exists()
    assert (pd.read_csv(failed / "results.csv")["status"] == "ok").all()


def test_a_job_is_named_relative_to_a_relative_sweep_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record_job(Path("sweep"), tmp_path / "sweep" / "encoding=rope", "boom")  # Hydra: relative sweep, absolute job
    assert outcomes(Path("sweep")) == (0, ["encoding=rope: boom"])
