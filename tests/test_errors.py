"""Every bad input named by the issue gives one line (exit code 2 at the CLI), never a traceback or lost results.

Checkpoints that are missing, truncated, from another encoding or with a vocabulary that does not
match the data are in test_checkpoint.py; a resume from a checkpoint of another config in test_train.py.
"""

from __future__ import annotations

import errno
import math
import os
import resource
import signal
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from posbench.commands.launch import validate_overrides
from posbench.data import DataConfig, build_corpus, load_corpus
from posbench.errors import PosbenchError, ReaderlessStream, describe, one_line_errors
from posbench.evaluate import evaluate_lengths
from posbench.io import write_csv
from posbench.model import LanguageModel
from posbench.report import collect_results, report
from posbench.runfolder import ERROR_FILE, ModelState, errors_recorded

REPO = Path(__file__).resolve().parents[1]


def config_error(*overrides: str, multirun: bool = False) -> str:
    with pytest.raises(PosbenchError) as e:
        validate_overrides("train", list(overrides), multirun)
    message = str(e.value)
    assert "\n" not in message
    return message


# --- names and keys -------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_unknown_encoding_names_the_valid_choices(posbench, assert_one_line):
    assert_one_line(
        posbench("train", "encoding=alibii"), "encoding/alibii", "valid choices", "alibi", "rope", "sinusoidal"
    )


@pytest.mark.parametrize(
    "group, valid", [("encoding", "alibi"), ("model", "tiny"), ("data", "wikitext2"), ("experiment", "smoke")]
)
def test_unknown_group_choice_names_the_valid_choices(group, valid):
    message = config_error(f"{group}=nonesuch")
    assert (
        f"Could not find '{group}/nonesuch'" in message
        and f"valid choices in '{group}'" in message
        and valid in message
    )


@pytest.mark.parametrize(
    "override, key", [("trian_len=5", "trian_len"), ("train.stpes=5", "stpes"), ("model.dmodel=64", "dmodel")]
)
def test_misspelt_key(override, key):
    assert f"Key '{key}' not in" in config_error(override)


@pytest.mark.parametrize("override", ["train_len=abc", "train.lr=fast", "train.steps=1.5", "debug=perhaps"])
def test_mistyped_value(override):
    message = config_error(override)
    assert message.startswith(f"Error merging override {override}; Value '{override.split('=')[1]}'")


def test_a_typo_in_any_job_of_a_sweep_fails_before_the_first_job():
    assert "encoding/alibii" in config_error("encoding=alibi,rope,alibii", multirun=True)


# --- lengths and shapes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("train_len=0", "train_len must hold positive integers, got 0"),
        ("train_len=-4", "train_len must hold positive integers, got -4"),
        ("eval_lens=[0]", "eval_lens must hold positive integers, got [0]"),
        ("eval_lens=[64,-1]", "eval_lens must hold positive integers, got [64, -1]"),
        ("train_len=2.5", "Value '2.5' of type 'float' could not be converted to Integer"),
        ("eval_lens=[1.5]", "could not be converted to Integer"),
        ("train.checkpoint_every=0", "train.checkpoint_every must be a positive integer, got 0"),
    ],
)
def test_non_positive_or_non_integer_lengths(override, message):
    assert message in config_error(override)


def test_d_model_not_divisible_by_n_heads():
    assert config_error("model.n_heads=3") == "model.d_model=256 is not divisible by model.n_heads=3"


def test_odd_head_dimension_for_rotary():
    message = config_error("encoding=rope", "model.d_model=36", "model.n_heads=4")
    assert message.startswith("encoding=rope:") and "even head dimension" in message and "9" in message


# --- data -----------------------------------------------------------------------------------------


def write_splits(folder: Path, **texts: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in texts.items():
        (folder / f"{split}.txt").write_text(text)
    return folder


def test_data_folder_missing(tmp_path):
    with pytest.raises(PosbenchError, match=r"data folder .*nowhere does not exist \(data.path\)"):
        load_corpus(DataConfig(path=str(tmp_path / "nowhere")))


def test_data_folder_empty(tmp_path):
    with pytest.raises(PosbenchError, match="has no train split"):
        load_corpus(DataConfig(path=str(write_splits(tmp_path / "empty"))))
    with pytest.raises(PosbenchError, match="the train split in .* is empty"):
        load_corpus(DataConfig(path=str(write_splits(tmp_path / "blank", train="\n \n", valid="a b\n", test="a\n"))))


def test_data_folder_missing_a_split(tmp_path):
    with pytest.raises(PosbenchError, match=r"has no test split \(expected test.txt or wiki.test.tokens\)"):
        load_corpus(DataConfig(path=str(write_splits(tmp_path / "d", train="a b\n", valid="a\n"))))


@pytest.mark.slow
def test_cli_runtime_error_is_one_line_and_recorded_in_the_run_folder(tmp_path, posbench, assert_one_line):
    run_dir = tmp_path / "run"
    done = posbench("train", "experiment=smoke", f"data.path={tmp_path / 'nowhere'}", f"hydra.run.dir={run_dir}")
    assert_one_line(done, "does not exist (data.path)")
    assert "does not exist (data.path)" in (run_dir / ERROR_FILE).read_text()


@pytest.mark.slow
def test_cli_debug_true_shows_the_traceback(tmp_path, posbench):
    done = posbench(
        "train", "experiment=smoke", f"data.path={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path}", "debug=true"
    )
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "PosbenchError" in done.stderr


# --- evaluation beyond an encoding's reach ---------------------------------------------------------


def test_eval_length_beyond_learned_positions_is_a_marked_row_not_an_error(compose_config, tmp_path):
    cfg = compose_config("train", ["experiment=smoke", "encoding=learned", "eval_lens=[32,64]", "eval.splits=[valid]"])
    words = " ".join(f"w{i % 50}" for i in range(400))
    corpus = build_corpus({"train": [words], "valid": [words], "test": [words]})
    model = LanguageModel(cfg.model, cfg.encoding, corpus.vocab_size, cfg.train_len)
    rows = evaluate_lengths(model, corpus, cfg, "cpu", tmp_path, ModelState("run", 1, True)).set_index("eval_len")
    assert rows.loc[32, "status"] == "ok" and math.isfinite(rows.loc[32, "ppl"])
    assert rows.loc[64, "status"] == "unsupported" and pd.isna(rows.loc[64, "ppl"])
    assert "32 positions" in rows.loc[64, "reason"]


# --- report ---------------------------------------------------------------------------------------


def finished_run(folder: Path, encoding: str) -> Path:
    rows = [
        dict(
            encoding=encoding,
            train_len=32,
            eval_len=n,
            split="test",
            ppl=100.0 + n,
            status="ok",
            reason="",
            run_dir=str(folder),
        )
        for n in (32, 64)
    ]
    write_csv(pd.DataFrame(rows), folder / "results.csv")
    return folder


def test_report_on_a_folder_without_runs(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(PosbenchError, match="no finished runs under"):
        report(tmp_path)
    with pytest.raises(PosbenchError, match="is not a folder"):
        report(tmp_path / "nowhere")


@pytest.mark.slow
def test_cli_report_on_a_folder_without_runs(tmp_path, posbench, assert_one_line):
    assert_one_line(posbench("report", str(tmp_path)), "no finished runs under")


def test_report_skips_unfinished_failed_and_unreadable_runs_and_reports_the_rest(tmp_path):
    finished_run(tmp_path / "encoding=alibi", "alibi")
    finished_run(tmp_path / "encoding=rope", "rope")
    failed = tmp_path / "encoding=none"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ERROR_FILE).write_text("training loss is nan at step 7; training stopped\n")
    unfinished = tmp_path / "encoding=learned"
    unfinished.mkdir()
    (unfinished / "last.pt").write_bytes(b"")
    running = tmp_path / "encoding=sinusoidal"
    (running / ".hydra").mkdir(parents=True)
    garbled = tmp_path / "encoding=t5"
    garbled.mkdir()
    (garbled / "results.csv").write_bytes(b"\xff\xfe\x00garbage")
    headless = tmp_path / "encoding=fire"
    headless.mkdir()
    (headless / "results.csv").write_text("eval_len,ppl\n32,10\n")

    results, skipped = collect_results(tmp_path)
    assert sorted(results["encoding"].unique()) == ["alibi", "rope"]
    assert skipped[failed] == "failed: training loss is nan at step 7; training stopped"
    assert skipped[unfinished].startswith("unfinished")
    assert skipped[running].startswith("incomplete")
    assert skipped[garbled].startswith("unreadable results.csv")
    assert skipped[headless].startswith("results.csv lacks encoding, train_len")

    out = report(tmp_path)
    summary = (out / "summary.md").read_text()
    assert "## Runs left out" in summary and f"`{failed}`: failed: training loss is nan" in summary
    assert sorted(pd.read_csv(out / "results.csv")["encoding"].unique()) == ["alibi", "rope"]
    _, skipped_again = collect_results(tmp_path)  # the report's own results.csv is not a run
    assert set(skipped_again) == set(skipped)


# --- runtime settings, checked before any data is read ---------------------------------------------


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("device=banana", "banana"),
        ("threads=-1", "threads must be a positive integer or null, got -1"),
        ("threads=0", "threads must be a positive integer or null, got 0"),
        ("eval_lens=[]", "eval_lens=[] holds no length"),
        ("eval_lens=[64,64,64]", "eval_lens must not repeat a length, got [64, 64, 64]"),
        ("eval.splits=[]", "eval.splits must hold some of train, valid, test"),
    ],
)
def test_runtime_settings_and_empty_lists_are_refused_not_replaced(override, fragment):
    assert fragment in config_error(override)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=-1", "train.lr must be a positive number, got -1.0"),
        ("train.lr=0", "train.lr must be a positive number, got 0.0"),
        ("train.lr=inf", "train.lr must be a positive number, got inf"),
        ("train.lr=nan", "train.lr must be a positive number, got nan"),
        ("train.min_lr_ratio=-0.1", "train.min_lr_ratio must be in [0, 1], got -0.1"),
        ("train.min_lr_ratio=2", "train.min_lr_ratio must be in [0, 1], got 2.0"),
        ("train.warmup_steps=-1", "train.warmup_steps must be a non-negative integer, got -1"),
        ("train.weight_decay=-0.1", "train.weight_decay must be a non-negative number, got -0.1"),
        ("train.grad_clip=0", "train.grad_clip must be a positive number, got 0.0"),
        ("train.loss_spike_ratio=1", "train.loss_spike_ratio must be a number above 1, got 1.0"),
        ("train.grad_spike_ratio=nan", "train.grad_spike_ratio must be a number above 1, got nan"),
        ("train.val_tokens=0", "train.val_tokens must be at least 2 (the first token is no target) or null, got 0"),
        ("train.val_tokens=1", "train.val_tokens must be at least 2 (the first token is no target) or null, got 1"),
        (
            "train.val_tokens=-512",
            "train.val_tokens must be at least 2 (the first token is no target) or null, got -512",
        ),
        ("train.copy_warmup_steps=-1", "train.copy_warmup_steps must be a non-negative number of steps, got -1"),
        ("train.copy_loss=first", "train.copy_loss must be one of all, repeat, copy, got 'first'"),
        ("train.copy_warmup_span=8", "train.copy_warmup_span shapes the copy warm-up: set train.copy_warmup_steps too"),
        (
            "train.copy_warmup_steps=5 train.copy_warmup_len=100",
            "train.copy_warmup_len must be positive, at most train_len=256, and divide train.batch_size x "
            "train_len = 4096 "
            "(equal tokens per step), got 100",
        ),
        (
            "train.copy_warmup_steps=5 train.copy_warmup_len=0",
            "train.copy_warmup_len must be positive, at most train_len=256, and divide train.batch_size x "
            "train_len = 4096 "
            "(equal tokens per step), got 0",
        ),
        (
            "train.copy_warmup_steps=5 train.copy_warmup_len=512",
            "train.copy_warmup_len must be positive, at most train_len=256, and divide train.batch_size x "
            "train_len = 4096 "
            "(equal tokens per step), got 512",
        ),
        (
            "train.copy_warmup_steps=5 train.copy_warmup_len=64 train.copy_warmup_span=33",
            "train.copy_warmup_span must be 2 to 32 tokens (the warm-up's sequences hold 65: the span twice), got 33",
        ),
        (
            "train.copy_warmup_steps=5 train.copy_warmup_span=1",
            "train.copy_warmup_span must be 2 to 128 tokens (the warm-up's sequences hold 257: the span twice), got 1",
        ),
        ("train.copy_vocab=1", "train.copy_vocab must be at least 2 words or null, got 1"),
        (
            "train.copy_vocab=64",
            "train.copy_vocab draws copy spans: set train.copy_fraction or train.copy_warmup_steps too",
        ),
        ("seed=-3", "seed must be an integer in [0, 2**64), got -3"),
        ("probe.seed=-1", "probe.seed=-1 must be a non-negative integer"),  # else the probes fail after training
    ],
)
def test_numbers_that_would_train_wrongly_or_fail_later_stop_at_start_up(override, message):
    assert config_error(*override.split()) == message


def test_cuda_asked_for_where_there_is_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "cuda" in config_error("device=cuda").lower()


# --- any exception, one line ------------------------------------------------------------------------


def test_an_unexpected_exception_is_one_line_and_recorded(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        with one_line_errors(debug=False), errors_recorded(tmp_path):
            raise ZeroDivisionError("float division by zero")
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip()
    assert (
        line
        == "posbench: error: ZeroDivisionError: float division by zero (unexpected; debug=true shows the traceback)"
    )
    assert (tmp_path / ERROR_FILE).read_text().startswith("ZeroDivisionError: float division by zero")


@pytest.mark.parametrize(
    "error, fragments",
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/runs/a/last.pt"),
            ["/runs/a/last.pt", "free some disk space", "from its last.pt if it saved one"],  # none may exist
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/runs/a"),
            ["/runs/a: Permission denied", "hydra.run.dir"],
        ),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/x.csv"), ["/mnt/ro/x.csv", "read-only"]),
    ],
)
def test_os_errors_name_their_path_and_what_to_do(error, fragments):
    for fragment in fragments:
        assert fragment in describe(error)


@pytest.mark.slow
def test_cli_read_only_run_folder_is_one_line(tmp_path, mini_data, posbench, assert_one_line, read_only):
    run_dir = read_only(tmp_path / "run")
    done = posbench("train", "experiment=smoke", f"data.path={mini_data}", f"hydra.run.dir={run_dir}")
    assert_one_line(done, str(run_dir))


@pytest.mark.slow
def test_cli_read_only_finished_run_eval_and_report_are_one_line(
    tmp_path, mini_data, posbench, assert_one_line, read_only
):
    run_dir = tmp_path / "run"
    train = ["train", "experiment=smoke", "eval_lens=[32]", f"data.path={mini_data}", f"hydra.run.dir={run_dir}"]
    assert posbench(*train).returncode == 0
    results = (run_dir / "results.csv").read_bytes()
    read_only(run_dir)

    again = posbench(*train)  # re-running the finished run only reads it
    assert again.returncode == 0 and "already holds this run, finished" in again.stdout + again.stderr
    assert_one_line(posbench("eval", f"checkpoint={run_dir}", "eval_lens=[64]", f"data.path={mini_data}"), str(run_dir))
    assert_one_line(posbench("report", str(run_dir)), str(run_dir))
    assert (run_dir / "results.csv").read_bytes() == results  # nothing lost


def file_size_limit(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.slow
def test_cli_full_disk_while_saving_a_checkpoint_is_one_line_naming_it(tmp_path, mini_data, posbench, assert_one_line):
    run_dir = tmp_path / "run"
    done = posbench(
        "train",
        "experiment=smoke",
        f"data.path={mini_data}",
        f"hydra.run.dir={run_dir}",
        preexec_fn=file_size_limit(256 * 1024),  # the logs fit, a checkpoint does not
    )
    line = assert_one_line(done, str(run_dir))
    assert ".pt" in line
    assert not list(run_dir.glob(".*.tmp"))  # no half-written file left behind
    assert (run_dir / ERROR_FILE).read_text().strip() == line.removeprefix("posbench: error: ")


def test_a_split_shorter_than_the_window_is_too_short_not_ok(compose_config, tmp_path):
    cfg = compose_config("train", ["experiment=smoke", "eval_lens=[32,64]", "eval.splits=[test]"])
    words = " ".join(f"w{i % 50}" for i in range(400))
    corpus = build_corpus({"train": [words], "valid": [words], "test": ["w1 w2 w3 w4 w5 " * 8]})
    model = LanguageModel(cfg.model, cfg.encoding, corpus.vocab_size, cfg.train_len)
    rows = evaluate_lengths(model, corpus, cfg, "cpu", tmp_path, ModelState("run", 1, True)).set_index("eval_len")
    assert rows.loc[32, "status"] == "ok"  # 40 words and an <eos>: 40 targets, one window of 32
    assert rows.loc[64, "status"] == "too_short" and pd.isna(rows.loc[64, "ppl"])
    assert rows.loc[64, "reason"] == "the test split has 40 targets (eval.max_tokens=4096), fewer than one window of 64"


@pytest.mark.slow
def test_cli_eval_on_a_malformed_results_csv_is_one_line_and_merges_nothing(
    tmp_path, mini_data, posbench, assert_one_line
):
    run_dir = tmp_path / "run"
    train = ["train", "experiment=smoke", "eval_lens=[32]", f"data.path={mini_data}", f"hydra.run.dir={run_dir}"]
    assert posbench(*train).returncode == 0
    (run_dir / "results.csv").write_text('encoding,eval_len\nalibi,"32\nbroken,row,with,too,many,fields\n')
    per_position = (run_dir / "per_position.csv").read_bytes()

    done = posbench("eval", f"checkpoint={run_dir}", "eval_lens=[64]", f"data.path={mini_data}")

    assert_one_line(done, str(run_dir / "results.csv"), "move it aside")
    assert (run_dir / "per_position.csv").read_bytes() == per_position  # nothing merged before the failure


def test_a_stream_whose_reader_has_gone_takes_writes_without_raising():
    read_end, write_end = os.pipe()
    os.close(read_end)
    raw = os.fdopen(write_end, "w")
    with pytest.raises(BrokenPipeError):  # what logging would print a traceback for, line after line
        raw.write("x" * 100_000)
    stream = ReaderlessStream(raw)
    assert stream.write("line\n") == 5
    stream.flush()
    assert stream.write("more\n") == 5 and stream.fileno() == write_end
    stream.close()


def test_cli_eval_piped_into_a_reader_that_has_gone_runs_to_its_end(tmp_path, saved_run, into_closed_pipe):
    """`posbench eval … | head`: its log lines go to a closed pipe; the job still writes all its rows."""
    run = saved_run(tmp_path / "run")
    done = into_closed_pipe([sys.executable, "-m", "posbench", "eval", f"checkpoint={run}", "eval_lens=[32,64]"])
    assert done.returncode == 0 and "Traceback" not in done.stderr and "Logging error" not in done.stderr
    assert sorted(pd.read_csv(run / "results.csv")["eval_len"].unique()) == [32, 64]


def test_problems_gathers_every_rule_and_raises_once():
    from posbench.errors import Problems, ProblemsFound

    def refuses(what):
        raise PosbenchError(f"{what} is wrong")

    def refuses_two():
        raise ProblemsFound(["c; d", "e"])

    problems = Problems()
    problems.add(["a.x must be positive, got 0"])
    assert problems.run(refuses, "b.y") is False
    assert problems.run(lambda: None) is True
    assert problems.run(refuses_two) is False  # its problems kept apart, not as one joined line
    with pytest.raises(ProblemsFound) as caught:
        problems.raise_any()
    assert caught.value.problems == ["a.x must be positive, got 0", "b.y is wrong", "c; d", "e"]
    assert str(caught.value) == "4 problems: (1) a.x must be positive, got 0; (2) b.y is wrong; (3) c; d; (4) e"
    assert isinstance(caught.value, ValueError)  # what a constructor given a bad config raises
    assert str(ProblemsFound(["one alone"])) == "one alone"  # one problem reads as it did before
    Problems().raise_any()  # none found: nothing raised
