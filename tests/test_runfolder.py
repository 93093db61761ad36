"""The run folder's rules: rows merged by their identity (the run, the state of its weights, the measurement),
stale rows dropped, legacy and gzipped files read; and, through the command line, that no command loses
another run's rows, reports rows of unfinished models, or touches what it did not make."""

import gzip
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from posbench.checkpoint import load_checkpoint
from posbench.runfolder import (
    CONTEXT_CSV,
    COPY_CSV,
    ERROR_FILE,
    PER_POSITION,
    RESULTS,
    ModelState,
    earlier_measurement,
    finalize,
    find,
    legacy_run_id,
    measured_rows,
    merge_rows,
    model_state,
    read_csv,
)

SMOKE = ["experiment=smoke", "threads=1", "eval_lens=[32,64]", "eval.splits=[test]"]


def rows(eval_lens, ppl, encoding="alibi", variant=""):
    return pd.DataFrame(
        dict(encoding=encoding, seed=0, split="test", eval_len=eval_lens, eval_mode="nonoverlapping")
        | dict(stride=eval_lens, variant=variant, precision="fp32", ppl=ppl)
    )


def test_a_merge_replaces_the_same_measurement_of_the_same_run_and_keeps_the_rest(tmp_path):
    run = ModelState("a", 10, True)
    merge_rows(tmp_path, RESULTS, rows([8, 16], [1.0, 2.0]), run)
    merge_rows(tmp_path, RESULTS, pd.concat([rows([16], [3.0]), rows([16], [4.0], variant="yarn×4")]), run)
    on_disk = read_csv(tmp_path / RESULTS)
    assert sorted(on_disk["ppl"]) == [1.0, 3.0, 4.0]


def test_rows_of_another_run_are_never_replaced(tmp_path):
    merge_rows(tmp_path, RESULTS, rows([8, 16], [1.0, 2.0]), ModelState("a", 10, True))
    merge_rows(tmp_path, RESULTS, rows([8, 16], [5.0, 6.0], encoding="rope"), ModelState("b", 10, True))
    merge_rows(tmp_path, RESULTS, rows([8, 16], [7.0, 8.0]), ModelState("c", 10, True))  # same encoding, seed
    on_disk = read_csv(tmp_path / RESULTS)
    assert sorted(on_disk["ppl"]) == [1.0, 2.0, 5.0, 6.0, 7.0, 8.0]
    assert on_disk.groupby("run_id").size().to_dict() == {"a": 2, "b": 2, "c": 2}


def test_measured_rows_are_the_rows_of_these_weights_once_training_had_ended(tmp_path):
    merge_rows(tmp_path, RESULTS, rows([8, 16], [1.0, 2.0], variant="window8"), ModelState("a", 10, True))
    merge_rows(tmp_path, RESULTS, rows([8], [3.0]), ModelState("a", 10, False))  # e.g. eval before the end
    merge_rows(tmp_path, RESULTS, rows([8], [4.0]), ModelState("b", 10, True))  # another run's
    kept = measured_rows(tmp_path, RESULTS, ModelState("a", 10, True))
    assert sorted(kept["ppl"]) == [1.0, 2.0]
    assert measured_rows(tmp_path, RESULTS, ModelState("a", 11, True)).empty  # other weights
    assert measured_rows(tmp_path, RESULTS, ModelState("a", 10, False)).empty  # training not ended: nothing kept
    assert measured_rows(tmp_path, COPY_CSV, ModelState("a", 10, True)).empty  # no such file
    same = rows([16], [float("nan")], variant="window8").iloc[0].to_dict()
    assert earlier_measurement(kept, same, RESULTS)["ppl"] == 2.0
    for other in (dict(same, variant=""), dict(same, eval_len=32), dict(same, precision="bf16")):
        assert earlier_measurement(kept, other, RESULTS) is None


def test_a_runs_rows_on_other_weights_are_dropped_when_it_writes_again(tmp_path):
    merge_rows(tmp_path, RESULTS, rows([8, 16], [1.0, 2.0]), ModelState("a", 84, False))
    merge_rows(tmp_path, RESULTS, rows([8], [0.5], variant="window8"), ModelState("a", 384, False))
    on_disk = read_csv(tmp_path / RESULTS)
    assert list(on_disk["model_step"]) == [384]  # step 84's rows measured weights that are gone


def test_finalize_drops_stale_rows_in_every_file_and_marks_the_final_weights_final(tmp_path):
    early, same = ModelState("a", 84, False), ModelState("a", 384, False)
    merge_rows(tmp_path, PER_POSITION, rows([8], [1.0]).assign(position=0, nll=1.0, count=3), early)
    merge_rows(
        tmp_path,
        CONTEXT_CSV,
        pd.DataFrame(dict(encoding=["alibi"], seed=0, variant="", split="test", context=4)),
        early,
    )
    merge_rows(tmp_path, COPY_CSV, pd.DataFrame(dict(encoding=["alibi"], seed=0, variant="", distance=0)), same)
    merge_rows(tmp_path, RESULTS, rows([8], [9.0], encoding="rope"), ModelState("b", 84, False))  # another run
    finalize(tmp_path, ModelState("a", 384, True))
    assert read_csv(tmp_path / PER_POSITION).empty
    assert read_csv(tmp_path / CONTEXT_CSV).empty
    copy = read_csv(tmp_path / COPY_CSV)
    assert list(copy["model_final"]) == [True]  # measured on these very weights before the end
    other = read_csv(tmp_path / RESULTS)
    assert (list(other["run_id"]), list(other["model_final"])) == (["b"], [False])


def test_rows_from_before_the_state_columns_are_the_folders_run_and_never_stale(tmp_path):
    rows([8, 16], [1.0, 2.0]).to_csv(tmp_path / RESULTS, index=False)
    legacy = read_csv(tmp_path / RESULTS)
    assert set(legacy["run_id"]) == {legacy_run_id(tmp_path)}
    assert legacy["model_step"].isna().all() and legacy["model_final"].all()
    merge_rows(tmp_path, RESULTS, rows([16], [3.0]), ModelState(legacy_run_id(tmp_path), 50, True))
    assert sorted(read_csv(tmp_path / RESULTS)["ppl"]) == [1.0, 3.0]  # replaced at 16, kept at 8


def test_gzipped_files_are_read_and_merged_in_place(tmp_path):
    with gzip.open(tmp_path / f"{RESULTS}.gz", "wt") as f:
        rows([8], [1.0]).to_csv(f, index=False)
    assert find(tmp_path, RESULTS) == tmp_path / f"{RESULTS}.gz"
    merge_rows(tmp_path, RESULTS, rows([16], [2.0]), ModelState("a", 1, True))
    assert not (tmp_path / RESULTS).exists()
    assert sorted(pd.read_csv(tmp_path / f"{RESULTS}.gz")["ppl"]) == [1.0, 2.0]


def test_a_checkpoint_from_before_run_ids_is_final_unless_last_pt_lies_beside_it(tmp_path):
    assert model_state({"step": 7}, tmp_path / "checkpoint.pt") == ModelState(legacy_run_id(tmp_path), 7, True)
    (tmp_path / "last.pt").write_bytes(b"")
    assert not model_state({"step": 7}, tmp_path / "checkpoint.pt").final
    assert model_state({"step": 7, "run_id": "x", "final": True}, tmp_path / "checkpoint.pt").final


# --- through the command line --------------------------------------------------------------------------------


def train(posbench, folder, *overrides):
    done = posbench("train", *SMOKE, f"hydra.run.dir={folder}", *overrides)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


@pytest.mark.slow
def test_report_refuses_a_report_folder_it_did_not_make_and_replaces_its_own(tmp_path, posbench, assert_one_line):
    train(posbench, tmp_path / "runs" / "a")
    users = tmp_path / "runs" / "report" / "alibi_run"
    users.mkdir(parents=True)
    (users / "checkpoint.pt").write_bytes(b"the user's")
    assert_one_line(posbench("report", str(tmp_path / "runs")), "holds what a report does not write (alibi_run)")
    assert (users / "checkpoint.pt").read_bytes() == b"the user's"
    users.parent.rename(tmp_path / "kept")
    for _ in range(2):  # the second replaces the first report, its own
        assert posbench("report", str(tmp_path / "runs")).returncode == 0
    assert (tmp_path / "runs" / "report" / "summary.md").is_file()


@pytest.mark.slow
def test_evals_of_two_runs_into_one_folder_keep_both_and_the_report_counts_two(tmp_path, posbench):
    alibi = train(posbench, tmp_path / "alibi", "encoding=alibi")
    rope = train(posbench, tmp_path / "rope", "encoding=rope")
    shared = tmp_path / "full_eval"
    for run in (alibi, rope):
        done = posbench("eval", f"checkpoint={run}", "eval_lens=[64]", f"hydra.run.dir={shared}")
        assert done.returncode == 0, done.stderr[-2000:]
    results = read_csv(shared / RESULTS)
    assert sorted(set(results["encoding"])) == ["alibi", "rope"]
    assert len(results) == 2  # each run: its split (test) at 64
    assert posbench("report", str(shared)).returncode == 0
    assert "2 runs under" in (shared / "report" / "summary.md").read_text()


@pytest.mark.slow
def test_runs_that_differ_in_a_result_changing_key_are_not_averaged_as_seeds(tmp_path, posbench):
    sweep = tmp_path / "sweep"
    done = posbench("-m", "train", *SMOKE, "train.lr=0.001,0.01", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert posbench("report", str(sweep)).returncode == 0
    summary = pd.read_csv(sweep / "report" / "summary.csv", keep_default_na=False)
    at_32 = summary[(summary["split"] == "test") & (summary["eval_len"] == 32)]
    assert sorted(at_32["config"]) == ["train.lr=0.001", "train.lr=0.01"]
    assert list(at_32["seeds"]) == [1, 1]
    assert "train.lr=0.01" in (sweep / "report" / "summary.md").read_text()


def interrupted(folder, steps=60):
    """A smoke run stopped by SIGTERM once it has a best checkpoint: an unfinished run."""
    own = [f"train.steps={steps}", "train.checkpoint_every=2", f"hydra.run.dir={folder}"]  # last.pt early
    command = [sys.executable, "-m", "posbench", "train", *SMOKE, *own]
    process = subprocess.Popen(command, env=dict(os.environ, OMP_NUM_THREADS="1"), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    # both: last.pt (every 2 steps) can come before the first validation writes the best checkpoint
    while not all((folder / name).exists() for name in ("last.pt", "checkpoint.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 2
    return [*SMOKE, *own]


@pytest.mark.slow
def test_rows_measured_before_a_run_finished_never_reach_a_report_and_go_when_it_finishes(tmp_path, posbench):
    run = tmp_path / "runs" / "alibi"
    again = interrupted(run)
    stopped = (run / ERROR_FILE).read_text()
    assert "stopped by SIGTERM" in stopped
    evaluated = posbench("eval", f"checkpoint={run}", "eval_lens=[32]", "eval.window=8")
    probed = posbench("probe", f"checkpoint={run}", "probes=[context]", "probe.contexts=[4,8]", "probe.targets=64")
    for done in (evaluated, probed):
        assert done.returncode == 0, done.stderr[-2000:]
        assert "is not finished" in done.stdout + done.stderr  # one warning line in the log
    assert (run / ERROR_FILE).read_text() == stopped  # eval and probe leave training's record alone
    early = load_checkpoint(run)["step"]
    assert not read_csv(run / RESULTS)["model_final"].any()
    failed = posbench("report", str(tmp_path / "runs"))
    assert failed.returncode == 2 and "unfinished" in failed.stderr  # the only run is left out

    done = posbench("train", *again)  # resumes and finishes
    assert done.returncode == 0, done.stderr[-2000:]
    final = load_checkpoint(run)
    assert final["final"] and not (run / "last.pt").exists() and not (run / ERROR_FILE).exists()
    for name in (RESULTS, PER_POSITION, "per_article.csv", CONTEXT_CSV):
        table = read_csv(run / name)
        kept = table["model_step"] == final["step"]
        assert kept.all() or early == final["step"], name  # no row of the earlier weights survives
        assert table["model_final"].all(), name
    assert posbench("report", str(tmp_path / "runs")).returncode == 0


@pytest.mark.slow
def test_a_symbolic_link_and_an_unfinished_run_are_listed_as_left_out(tmp_path, posbench):
    elsewhere = train(posbench, tmp_path / "elsewhere")
    runs = tmp_path / "runs"
    train(posbench, runs / "a")
    (runs / "linked").symlink_to(elsewhere, target_is_directory=True)
    interrupted(runs / "b")
    posbench("eval", f"checkpoint={runs / 'b'}", "eval_lens=[32]")  # gives the unfinished run a results.csv
    assert posbench("report", str(runs)).returncode == 0
    summary = (runs / "report" / "summary.md").read_text()
    assert "1 runs under" in summary
    left_out = summary.split("## Runs left out")[1]
    assert "linked" in left_out and "symbolic link" in left_out
    assert "`" + str(runs / "b") + "`: unfinished" in left_out


@pytest.mark.slow
def test_a_report_killed_while_building_is_cleaned_up_by_the_next(tmp_path, posbench):
    runs = train(posbench, tmp_path / "runs" / "a").parent
    command = [sys.executable, "-m", "posbench", "report", str(runs)]
    process = subprocess.Popen(command, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 60
    while not list(runs.glob(".report.*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    process.kill()
    process.wait()
    assert list(runs.glob(".report.*")), "the report finished before it could be killed"
    assert posbench("report", str(runs)).returncode == 0
    assert not list(runs.glob(".report.*"))


@pytest.mark.slow
def test_a_non_finite_evaluation_is_status_nonfinite_not_ok(tmp_path, posbench):
    run = train(posbench, tmp_path / "run")
    done = posbench("eval", f"checkpoint={run}", "eval_lens=[32]", "eval.attn_temperature=1e300")
    assert done.returncode == 0, done.stderr[-2000:]
    hot = read_csv(run / RESULTS).query("variant == 'temp1e+300'")
    assert list(hot["status"]) == ["nonfinite"]  # the run's one split at 32
    assert hot["reason"].str.contains("NaN or infinite").all() and hot["ppl"].isna().all()
