"""Hydra launchers: submitit runs the pickled job in another process; joblib runs a sweep's jobs side by side."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pandas as pd
import pytest

SMOKE = ["experiment=smoke", "device=cpu", "threads=1", "eval_lens=[32,64]"]


def sweep(args: list[str], mini_data, sweep_dir) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "posbench",
        "-m",
        "train",
        *SMOKE,
        f"data.path={mini_data}",
        f"hydra.sweep.dir={sweep_dir}",
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=sweep_dir.parent, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_submitit_local_pickles_the_job_and_runs_it_in_another_process(tmp_path, mini_data):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep_dir = tmp_path / "sweep"
    sweep(["hydra/launcher=submitit_local", "encoding=rope"], mini_data, sweep_dir)

    files = [p.name for p in (sweep_dir / ".submitit").rglob("*") if p.is_file()]
    assert len([name for name in files if name.endswith("_submitted.pkl")]) == 1, files  # the job went through pickle
    assert len([name for name in files if name.endswith("_result.pkl")]) == 1, (
        files
    )  # and came back from the worker process
    (results_path,) = sweep_dir.rglob("results.csv")
    results = pd.read_csv(results_path)
    assert list(results["eval_len"]) == [32, 64, 32, 64] and (results["status"] == "ok").all()


@pytest.mark.slow
def test_joblib_sweep_runs_two_encodings_with_one_thread_each(tmp_path, mini_data):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep_dir = tmp_path / "sweep"
    done = sweep(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "encoding=alibi,rope"], mini_data, sweep_dir)

    assert "Joblib.Parallel(n_jobs=2" in done.stdout + done.stderr
    runs = sorted(p.parent for p in sweep_dir.rglob("results.csv"))
    assert sorted(pd.read_csv(run / "results.csv")["encoding"].iloc[0] for run in runs) == ["alibi", "rope"]
    for run in runs:
        assert (pd.read_csv(run / "results.csv")["status"] == "ok").all()
        assert re.search(r"torch threads 1\b", (run / "train.log").read_text())


def test_slurm_sweep_off_a_cluster_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no srun
    command = [sys.executable, "-m", "posbench", "-m", "train", "hydra/launcher=slurm", "encoding=alibi,rope"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "hydra/launcher=slurm needs a SLURM cluster" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists()  # stopped before Hydra made the sweep folder
