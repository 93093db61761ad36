"""Training: resume gives the uninterrupted run's numbers exactly, finished runs are skipped, faults stop cleanly."""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from posbench import runtime, training_run
from posbench import train as train_module
from posbench.checkpoint import CHECKPOINT, RESUME_CHECKPOINT, load_checkpoint
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.errors import PosbenchError
from posbench.model import LanguageModel
from posbench.optim import lr_factor
from posbench.runfolder import lock_run_dir
from posbench.sweep import data_tag
from posbench.train import train
from posbench.training_run import check_splits

REPO = Path(__file__).resolve().parents[1]
#: Seconds of training and evaluation: validation every 4 steps, resume state every 3 (plus train.steps, eval_lens).
TINY = [
    "experiment=smoke",
    "train.eval_every=4",
    "train.checkpoint_every=3",
    "eval.splits=[valid]",
    "eval.max_tokens=1024",
    "train.val_tokens=512",
]
SMALL = [*TINY, "train.steps=10", "eval_lens=[32,64]"]


@pytest.fixture
def small_config(compose_config, mini_data):
    def _config(*overrides: str):
        return compose_config("train", [*SMALL, f"data.path={mini_data}", *overrides])

    return _config


def numbers(results: pd.DataFrame) -> pd.DataFrame:
    """results.csv without the columns that name the folder and the run (two runs, the same numbers)."""
    return results.drop(columns=["run_dir", "run_id"]).reset_index(drop=True)


def test_lr_factor_warms_up_then_decays_to_min_ratio():
    assert lr_factor(0, warmup=4, total=20, min_ratio=0.1) == pytest.approx(0.25)
    assert lr_factor(3, warmup=4, total=20, min_ratio=0.1) == pytest.approx(1.0)
    assert lr_factor(12, warmup=4, total=20, min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way: cos(pi/2)=0
    assert lr_factor(20, warmup=4, total=20, min_ratio=0.1) == pytest.approx(0.1)


def interrupt_at(monkeypatch, call: int, signum=signal.SIGTERM) -> None:
    """Send this process ``signum`` while the ``call``-th training batch is drawn."""
    calls = {"n": 0}
    sample = train_module.sample_batch

    def sample_and_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            signal.raise_signal(signum)
        return sample(*args, **kwargs)

    monkeypatch.setattr(train_module, "sample_batch", sample_and_signal)


@pytest.mark.slow
def test_signal_saves_state_and_resume_matches_uninterrupted_run(small_config, tmp_path, monkeypatch):
    reference = train(small_config(), tmp_path / "reference")
    interrupt_at(monkeypatch, call=5)  # step 5: after the periodic checkpoint at 3, before the one at 6
    with pytest.raises(PosbenchError, match="stopped by SIGTERM at step 5 of 10"):
        train(small_config(), tmp_path / "run")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again
    state = load_checkpoint(tmp_path / "run" / RESUME_CHECKPOINT)
    assert (
        state["progress"]["step"] == 5 and state["progress"]["tokens_seen"] == 5 * 4 * 32
    )  # steps x batch x train_len
    assert not (tmp_path / "run" / "results.csv").exists()
    assert len(pd.read_csv(tmp_path / "run" / "train_log.csv")) == 5  # log_every=1 in smoke

    monkeypatch.undo()
    resumed = train(small_config(), tmp_path / "run")
    assert resumed["best_valid_loss"] == reference["best_valid_loss"]
    pd.testing.assert_frame_equal(numbers(resumed["results"]), numbers(reference["results"]), check_exact=True)
    pd.testing.assert_frame_equal(
        numbers(pd.read_csv(tmp_path / "run" / "results.csv")),
        numbers(pd.read_csv(tmp_path / "reference" / "results.csv")),
        check_exact=True,
    )
    logs = [pd.read_csv(tmp_path / d / "train_log.csv").drop(columns="tokens_per_s") for d in ("reference", "run")]
    pd.testing.assert_frame_equal(*logs, check_exact=True)
    assert not (tmp_path / "run" / RESUME_CHECKPOINT).exists()  # finished: checkpoint.pt and results.csv remain
    assert load_checkpoint(tmp_path / "run" / CHECKPOINT)["valid_loss"] == reference["best_valid_loss"]


@pytest.mark.slow
def test_finished_run_is_skipped_and_a_changed_config_is_refused(small_config, tmp_path, monkeypatch):
    first = train(small_config(), tmp_path)
    results_written = (tmp_path / "results.csv").stat().st_mtime_ns
    monkeypatch.setattr(training_run, "load_corpus", lambda cfg: pytest.fail("a finished run must not train again"))
    again = train(small_config(), tmp_path)
    assert (tmp_path / "results.csv").stat().st_mtime_ns == results_written
    assert list(again["results"]["ppl"]) == list(first["results"]["ppl"])
    with pytest.raises(
        PosbenchError, match=r"finished run that has another config \(train.lr: 0.003 -> 0.001\).*train.resume=false"
    ):
        train(small_config("train.lr=0.001"), tmp_path)


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_another_config(small_config, tmp_path, monkeypatch):
    interrupt_at(monkeypatch, call=5)
    with pytest.raises(PosbenchError, match="stopped by SIGTERM"):
        train(small_config(), tmp_path)
    monkeypatch.undo()
    with pytest.raises(PosbenchError, match=r"last.pt has another config \(train.lr: 0.003 -> 0.001\)"):
        train(small_config("train.lr=0.001"), tmp_path)
    with pytest.raises(PosbenchError, match="trained with encoding=alibi, not encoding=rope"):
        train(small_config("encoding=rope"), tmp_path)
    with pytest.raises(PosbenchError, match="holds no training state"):  # the best model alone cannot resume training
        train(small_config(f"train.resume={tmp_path / CHECKPOINT}"), tmp_path / "other")


@pytest.mark.slow
def test_a_bf16_run_is_neither_resumed_nor_skipped_where_auto_means_fp32(small_config, tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "cpu_flags", lambda: {"avx512_bf16"})  # the machine that trained: auto is bf16
    interrupt_at(monkeypatch, call=5)
    with pytest.raises(PosbenchError, match="stopped by SIGTERM"):
        train(small_config("precision=auto"), tmp_path)
    assert load_checkpoint(tmp_path / RESUME_CHECKPOINT)["precision"] == "bf16"
    monkeypatch.undo()
    monkeypatch.setattr(runtime, "cpu_flags", lambda: set())  # another machine: auto is fp32 here
    with pytest.raises(PosbenchError, match=r"last.pt has another config \(precision: bf16 -> fp32\)"):
        train(small_config("precision=auto"), tmp_path)
    train(small_config("precision=bf16"), tmp_path)  # asked for what it ran in, it goes on and finishes
    assert load_checkpoint(tmp_path / CHECKPOINT)["precision"] == "bf16"
    with pytest.raises(PosbenchError, match=r"holds a finished run that has another config \(precision: bf16 -> fp32"):
        train(small_config("precision=auto"), tmp_path)  # nor are its bf16 numbers returned as fp32's


@pytest.mark.slow
def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(small_config, tmp_path, monkeypatch):
    calls = {"n": 0}
    token_nll = LanguageModel.token_nll

    def nan_at_step_7(self, idx, targets):
        nll = token_nll(self, idx, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 7:
                return nll * float("nan")
        return nll

    monkeypatch.setattr(LanguageModel, "token_nll", nan_at_step_7)
    with pytest.raises(PosbenchError, match=r"training loss is nan at step 7; .*checkpoint.pt \(best, step 4\) kept"):
        train(small_config(), tmp_path)
    assert load_checkpoint(tmp_path / CHECKPOINT)["step"] == 4  # the best model of the validation at step 4
    assert load_checkpoint(tmp_path / RESUME_CHECKPOINT)["progress"]["step"] == 6  # the last periodic state
    log = pd.read_csv(tmp_path / "train_log.csv")
    assert list(log["step"]) == [1, 2, 3, 4, 5, 6, 7] and math.isnan(log["train_loss"].iloc[-1])
    assert log["valid_loss"].notna().sum() == 1  # what was evaluated so far: the validation at step 4
    assert not (tmp_path / "results.csv").exists()


@pytest.mark.slow
def test_spikes_are_flagged_in_train_log(small_config, tmp_path, monkeypatch):
    token_nll = LanguageModel.token_nll
    calls = {"n": 0}

    def spike_at_step_6(self, idx, targets):
        nll = token_nll(self, idx, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] == 6:
                return nll * 10.0  # ten times the loss and the gradient: beyond both default ratios (1.5, 5)
        return nll

    monkeypatch.setattr(LanguageModel, "token_nll", spike_at_step_6)
    train(small_config(), tmp_path)
    log = pd.read_csv(tmp_path / "train_log.csv").set_index("step")
    assert log.loc[6, "loss_spike"] and log.loc[6, "grad_spike"]
    assert not log.drop(index=6)["loss_spike"].any()


def test_a_loss_spike_needs_a_real_rise_not_only_a_ratio():
    """1.5 times a solved task's 0.001 is no spike (the 0.1-nat floor); 1.5 times a loss of 2 is one."""
    limits = SimpleNamespace(loss_spike_ratio=1.5, grad_spike_ratio=5.0)
    near_zero = training_run.Progress(loss_average=0.001, grad_average=1.0)
    assert near_zero.spikes(1, 0.05, 1.0, limits) == (False, False)  # 50 times the average, 0.049 nats up
    assert near_zero.spikes(2, 0.2, 1.0, limits) == (True, False)  # the average is now 0.0059: 0.19 nats up
    text = training_run.Progress(loss_average=2.0, grad_average=1.0)
    assert text.spikes(1, 2.9, 1.0, limits) == (False, False)  # 1.45 times
    assert text.spikes(2, 3.2, 6.0, limits) == (True, True)


def fail_at_call(monkeypatch, module, name: str, call: int) -> dict:
    """``module.name`` raises at its ``call``-th call (a kill in the middle of training's finish); the calls
    are counted in the returned dict's ``n``."""
    calls, function = {"n": 0}, getattr(module, name)

    def counted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise RuntimeError(f"killed in {name}")
        return function(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.slow
def test_a_finish_killed_between_lengths_and_probes_resumes_where_it_was(small_config, tmp_path, monkeypatch):
    """A kill during the evaluation, then one during the probes: each retry measures only what is missing,
    and the run's CSVs hold the uninterrupted run's numbers."""
    from posbench import evaluate
    from posbench.probes import copy, suite

    config = lambda: small_config("probes=[context,window,copy]", "probe.contexts=[4,16]", "probe.trials=4")  # noqa: E731
    train(config(), tmp_path / "reference")
    lengths = fail_at_call(monkeypatch, evaluate, "timed_score", call=2)  # at 64, after 32 was measured
    with pytest.raises(RuntimeError, match="killed in timed_score"):
        train(config(), tmp_path / "run")
    assert list(pd.read_csv(tmp_path / "run" / "results.csv")["eval_len"]) == [32]  # kept at once
    monkeypatch.undo()
    lengths = fail_at_call(monkeypatch, evaluate, "timed_score", call=0)  # counts only
    contexts = fail_at_call(monkeypatch, suite, "context_usage", call=0)
    fail_at_call(monkeypatch, copy, "score_copies", call=2)  # its first distance measured
    with pytest.raises(RuntimeError, match="killed in score_copies"):
        train(config(), tmp_path / "run")
    assert lengths["n"] == 1 + 2 and contexts["n"] == 1  # 64 alone, then the window probe's 32 and 64
    assert list(pd.read_csv(tmp_path / "run" / "copy_probe.csv")["distance"]) == [0]  # kept at once
    monkeypatch.undo()
    lengths = fail_at_call(monkeypatch, evaluate, "timed_score", call=0)
    contexts = fail_at_call(monkeypatch, suite, "context_usage", call=0)
    copies = fail_at_call(monkeypatch, copy, "score_copies", call=0)
    train(config(), tmp_path / "run")
    assert lengths["n"] == 0 and contexts["n"] == 0  # the evaluation, context and window probes kept
    assert copies["n"] == len(pd.read_csv(tmp_path / "reference" / "copy_probe.csv")) - 1  # all but distance 0
    assert not (tmp_path / "run" / RESUME_CHECKPOINT).exists()
    for name in ("results.csv", "per_position.csv", "context_usage.csv", "copy_probe.csv"):
        ours, reference = (pd.read_csv(tmp_path / run / name) for run in ("run", "reference"))
        keys = [c for c in ("variant", "eval_len", "position", "context", "subset", "distance") if c in ours]
        ours, reference = (
            t.drop(columns=["run_dir", "run_id"], errors="ignore").sort_values(keys) for t in (ours, reference)
        )
        pd.testing.assert_frame_equal(ours.reset_index(drop=True), reference.reset_index(drop=True), check_exact=True)


@pytest.mark.slow
def test_a_probe_killed_between_its_csvs_is_measured_again_not_kept_half(small_config, tmp_path, monkeypatch):
    from posbench.probes import suite

    merge = suite.merge_rows

    def killed_at_bias_curves(folder, name, rows, state):
        if name == "bias_curves.csv":
            raise RuntimeError("killed while merging bias_curves.csv")
        return merge(folder, name, rows, state)

    monkeypatch.setattr(suite, "merge_rows", killed_at_bias_curves)
    with pytest.raises(RuntimeError, match="killed while merging"):
        train(small_config("encoding=alibi", "probes=[attention]"), tmp_path)
    monkeypatch.undo()
    train(small_config("encoding=alibi", "probes=[attention]"), tmp_path)
    assert len(pd.read_csv(tmp_path / "bias_curves.csv")) and len(pd.read_csv(tmp_path / "attention_stats.csv"))


@pytest.mark.slow
def test_killed_subprocess_resumes_to_the_uninterrupted_numbers(mini_data, tmp_path):
    """SIGKILL (no chance to save) mid-training: the periodic last.pt is all there is, and it is enough."""
    args = [*TINY, "train.steps=16", "eval_lens=[32,64]", f"data.path={mini_data}"]

    def command(run_dir: Path) -> list[str]:
        return [sys.executable, "-m", "posbench", "train", *args, f"hydra.run.dir={run_dir}"]

    reference = subprocess.Popen(
        command(tmp_path / "reference"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    killed = subprocess.Popen(command(tmp_path / "run"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / RESUME_CHECKPOINT).exists():
        assert killed.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert not (tmp_path / "run" / "results.csv").exists()
    resumed = subprocess.run(command(tmp_path / "run"), cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr + resumed.stdout
    assert reference.wait() == 0, reference.stderr.read()
    results = [numbers(pd.read_csv(tmp_path / d / "results.csv")) for d in ("reference", "run")]
    pd.testing.assert_frame_equal(*results, check_exact=True)


@pytest.mark.slow
def test_relaunched_sweep_skips_finished_jobs_in_stable_folders(mini_data, tmp_path):
    sweep = tmp_path / "sweep"

    def launch(encodings: str) -> subprocess.CompletedProcess:
        args = [
            "-m",
            "train",
            f"encoding={encodings}",
            *TINY,
            "train.steps=4",
            "eval_lens=[32]",
            f"data.path={mini_data}",
            f"hydra.sweep.dir={sweep}",
        ]
        return subprocess.run([sys.executable, "-m", "posbench", *args], cwd=REPO, capture_output=True, text=True)

    first = launch("none")
    assert first.returncode == 0, first.stderr
    (run,) = [d for d in sweep.iterdir() if d.is_dir()]
    # named by its overrides (sorted; RESUME_IGNORED keys left out, data.path as a tag last), not by its job number
    assert run.name.startswith("encoding=none,eval.max_tokens=1024,") and run.name.endswith(data_tag(str(mini_data)))
    written = (run / "results.csv").stat().st_mtime_ns
    second = launch("none,alibi")
    assert second.returncode == 0, second.stderr
    assert "already holds this run, finished" in second.stdout + second.stderr
    assert (run / "results.csv").stat().st_mtime_ns == written
    assert (sweep / run.name.replace("encoding=none", "encoding=alibi") / "results.csv").is_file()


@pytest.mark.parametrize(
    "override, message",
    [
        ("device=banana", "device must be auto, cpu, cuda or cuda:N, got 'banana'"),
        ("threads=0", "threads must be a positive integer or null, got 0"),
        ("threads=-1", "threads must be a positive integer or null, got -1"),
    ],
)
def test_bad_device_or_threads_is_a_one_line_error(small_config, tmp_path, override, message):
    with pytest.raises(PosbenchError, match=re.escape(message)):
        train(small_config(override), tmp_path)
    assert not (tmp_path / RESUME_CHECKPOINT).exists()


def test_a_folder_another_process_writes_to_is_refused(small_config, tmp_path):
    with lock_run_dir(tmp_path):
        with pytest.raises(PosbenchError, match=rf"another posbench process \(pid {os.getpid()}\) is writing to"):
            train(small_config(), tmp_path)
    assert not (tmp_path / RESUME_CHECKPOINT).exists()


@pytest.mark.slow
def test_eval_on_an_interrupted_run_neither_finishes_it_nor_writes_while_it_is_locked(
    small_config, compose_config, tmp_path, monkeypatch, caplog
):
    interrupt_at(monkeypatch, call=5)
    with pytest.raises(PosbenchError, match="stopped by SIGTERM"):
        train(small_config(), tmp_path)
    monkeypatch.undo()
    register()
    command = compose_config("eval", [f"checkpoint={tmp_path}", "eval_lens=[32,64]", "eval.splits=[valid]"])
    keys = ["checkpoint", "eval_lens", "eval.splits"]
    with lock_run_dir(tmp_path), pytest.raises(PosbenchError, match="another posbench process"):
        evaluate_checkpoint(command, keys, tmp_path)
    evaluate_checkpoint(command, keys, tmp_path)  # a complete results.csv beside last.pt
    caplog.set_level(logging.INFO, logger="posbench")
    train(small_config(), tmp_path)
    assert "resumed from" in caplog.text and "already holds this run" not in caplog.text
    assert not (tmp_path / RESUME_CHECKPOINT).exists()


def test_a_valid_split_shorter_than_one_window_is_said(small_config, caplog):
    """train_len 32: 16 validation tokens (15 targets) are one shorter window; 33 tokens fill one window.
    Under torchrun only rank 0, which validates, says it. (The train split's rule, from the same check:
    tests/test_train_lengths.py.)"""
    caplog.set_level(logging.WARNING, logger="posbench.training_run")
    corpus = SimpleNamespace(splits={"train": torch.zeros(1000), "valid": torch.zeros(100)})
    check_splits(corpus, small_config("train.val_tokens=16"))
    assert [r.getMessage() for r in caplog.records] == [
        "the valid split has 15 targets (train.val_tokens=16), fewer than one window of train_len=32: "
        "validation (the best checkpoint, patience) scores them in one shorter window"
    ]
    check_splits(corpus, small_config("train.val_tokens=33"))
    check_splits(corpus, small_config("train.val_tokens=16"), validates=False)
    assert len(caplog.records) == 1


@pytest.mark.slow
def test_resume_false_starts_afresh_without_the_old_runs_rows(small_config, tmp_path):
    train(small_config(), tmp_path)
    stale = pd.read_csv(tmp_path / "per_position.csv").assign(variant="stale")
    pd.concat([pd.read_csv(tmp_path / "per_position.csv"), stale]).to_csv(tmp_path / "per_position.csv", index=False)
    (tmp_path / "extra_results.csv").write_text("a\n1\n")
    train(small_config("train.resume=false", "train.lr=0.001"), tmp_path)  # another config: no mismatch error
    positions = pd.read_csv(tmp_path / "per_position.csv", keep_default_na=False)
    assert set(positions["variant"]) == {""} and not (tmp_path / "extra_results.csv").exists()
    assert load_checkpoint(tmp_path / CHECKPOINT)["config"].train.lr == 0.001


@pytest.mark.slow
def test_copy_fraction_changes_training_and_resume_stays_exact(small_config, tmp_path, monkeypatch):
    plain = train(small_config(), tmp_path / "plain")
    reference = train(small_config("train.copy_fraction=0.5"), tmp_path / "reference")
    assert reference["best_valid_loss"] != plain["best_valid_loss"]
    interrupt_at(monkeypatch, call=5)
    with pytest.raises(PosbenchError, match="stopped by SIGTERM at step 5 of 10"):
        train(small_config("train.copy_fraction=0.5"), tmp_path / "run")
    monkeypatch.undo()
    resumed = train(small_config("train.copy_fraction=0.5"), tmp_path / "run")
    assert resumed["best_valid_loss"] == reference["best_valid_loss"]
    pd.testing.assert_frame_equal(numbers(resumed["results"]), numbers(reference["results"]), check_exact=True)
