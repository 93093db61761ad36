"""Sweeps finish: a failed job is recorded and the others run; a re-launch retries only the failed ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_whole_sweep_with_its_summary(tmp_path, mini_data, signum):
    sweep_dir = tmp_path / "sweep"
    args = [
        *SMOKE,
        f"data.path={mini_data}",
        "train.steps=100000",
        "train.eval_every=100000",
        "train.checkpoint_every=1",
    ]
    command = [sys.executable, "-m", "posbench", "-m", "train", *args, "seed=0,1,2", f"hydra.sweep.dir={sweep_dir}"]
    environ = dict(os.environ, OMP_NUM_THREADS="1")
    process = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = next(sweep_dir.glob("*seed=0*"), None) if sweep_dir.exists() else None
    deadline = time.monotonic() + 120
    while not (first and (first / "last.pt").exists()) and time.monotonic() < deadline:  # the first job trains
        time.sleep(0.2)
        first = next(sweep_dir.glob("*seed=0*"), None) if sweep_dir.exists() else None
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr and "Error executing job" not in stderr, stderr[-3000:]
    assert f"sweep {sweep_dir}: 0 finished, 1 failed" in stderr and "2 job(s) not started" in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"posbench: error: stopped by {signal.Signals(signum).name} at step "), last
    assert [p.name for p in sweep_dir.iterdir() if p.is_dir()] == [first.name]  # later jobs never ran
    assert not list(sweep_dir.rglob("results.csv"))


def test_a_job_is_named_relative_to_a_relative_sweep_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record_job(Path("sweep"), tmp_path / "sweep" / "encoding=rope", "boom")  # Hydra: relative sweep, absolute job
    assert outcomes(Path("sweep")) == (0, ["encoding=rope: boom"])
