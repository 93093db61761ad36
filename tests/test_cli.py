"""The command line end to end: help, one-line errors, a smoke training run, a sweep and its report."""

import pandas as pd
import pytest

from posbench.cli import main
from posbench.commands.launch import validate_overrides
from posbench.commands.report import report_options
from posbench.errors import PosbenchError
from posbench.report import Selection


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "report" in out


def test_unknown_command_is_one_line(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown command 'trian'" in err and "\n" not in err


def test_report_options_are_key_value_words_in_any_order():
    assert report_options([]) == (None, Selection())
    words = ["modes=nonoverlapping", "compare=alibi", "variants=window256,yarn×4"]
    assert report_options(words) == ("alibi", Selection(variants=("window256", "yarn×4"), modes=("nonoverlapping",)))
    assert report_options(["variants="]) == (None, Selection(variants=()))  # the models as trained only


@pytest.mark.parametrize(
    "words, message",
    [
        (["against=rope"], "report takes DIR and compare=ENCODING, variants=LIST, modes=LIST, not 'against=rope'"),
        (["compare="], "report takes DIR and compare=ENCODING, variants=LIST, modes=LIST, not 'compare='"),
        (["modes="], "report takes DIR and compare=ENCODING, variants=LIST, modes=LIST, not 'modes='"),
        (["variants=a", "variants=b"], "report: variants= given twice"),
    ],
)
def test_report_options_refuse_what_they_do_not_know(words, message):
    with pytest.raises(PosbenchError) as caught:
        report_options(words)
    assert str(caught.value) == message


def test_train_help_shows_config_groups(posbench):
    result = posbench("train", "--help")
    assert result.returncode == 0
    for group in ("encoding:", "model:", "experiment:", "alibi", "rope", "smoke"):
        assert group in result.stdout


@pytest.mark.parametrize(
    "override, message",
    [
        ("encoding=alibii", "valid choices in 'encoding': alibi"),
        ("trian_len=5", "Key 'trian_len' not in"),
        ("train_len=0", "train_len must hold positive integers"),
        ("model.attention=fash", "model.attention must be one of auto, sdpa, flex, eager"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(override, message, posbench):
    result = posbench("train", override)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.slow
def test_smoke_run_writes_every_requested_length(mini_data, tmp_path, posbench):
    run_dir = tmp_path / "run"
    result = posbench(
        "train",
        "encoding=learned",
        "experiment=smoke",
        f"data.path={mini_data}",
        "eval_lens=[16,32,64]",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr
    results = pd.read_csv(run_dir / "results.csv")
    assert sorted(results["eval_len"].unique()) == [16, 32, 64]
    assert set(results["split"]) == {"valid", "test"}
    ok = results[results["status"] == "ok"]
    assert (ok["eval_len"] <= 32).all() and (ok["ppl"] > 1).all()
    unsupported = results[results["eval_len"] == 64]
    assert (unsupported["status"] == "unsupported").all() and unsupported["ppl"].isna().all()
    for name in ("train_log.csv", "checkpoint.pt", ".hydra/config.yaml"):
        assert (run_dir / name).exists()


@pytest.mark.slow
def test_sweep_then_report(mini_data, tmp_path, posbench):
    sweep_dir = tmp_path / "sweep"
    result = posbench(
        "-m",
        "train",
        "encoding=alibi,rope",
        "experiment=smoke",
        "train.steps=2",
        f"data.path={mini_data}",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert result.returncode == 0, result.stderr
    result = posbench("report", str(sweep_dir))
    assert result.returncode == 0, result.stderr
    report = sweep_dir / "report"
    combined = pd.read_csv(report / "results.csv")
    assert set(combined["encoding"]) == {"alibi", "rope"}
    assert len(combined) == 2 * 2 * 5  # encodings x splits x default eval lengths (32 x 1..16)
    summary = (report / "summary.md").read_text()
    assert "| alibi |" in summary and "| rope |" in summary and "512" in summary
    assert (report / "ppl_vs_length.png").stat().st_size > 10_000


def test_report_on_an_empty_folder_is_one_line(tmp_path, posbench):
    result = posbench("report", str(tmp_path))
    assert result.returncode == 2
    assert "no finished runs" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "override, multirun, fragment",
    [
        ("hydra.run.dir=~/runs/a b", False, "hydra.run.dir: cannot read 'hydra.run.dir=~/runs/a b'"),
        ("hydra.run.dir=runs/a=b", False, "hydra.run.dir: cannot read 'hydra.run.dir=runs/a=b'"),
        ("hydra.sweep.dir=runs/a,b", True, "hydra.sweep.dir: a comma makes a sweep, and Hydra's own settings cannot"),
    ],
)
def test_an_unquoted_path_names_its_key_and_says_to_quote_it(override, multirun, fragment):
    with pytest.raises(PosbenchError) as e:
        validate_overrides("train", [override], multirun)
    assert str(e.value).startswith(fragment) and "quote" in str(e.value) and "\n" not in str(e.value)
    quoted = f"{override.split('=')[0]}='{override.split('=', 1)[1]}'"
    validate_overrides("train", [quoted], multirun)  # what the line says to do works


@pytest.mark.slow
def test_a_refused_train_changes_nothing_in_the_folder(tmp_path, mini_data, posbench, assert_one_line):
    from posbench.runfolder import lock_run_dir

    run = tmp_path / "run"
    train = ["train", "experiment=smoke", "eval_lens=[32]", f"data.path={mini_data}", f"hydra.run.dir={run}"]
    assert posbench(*train).returncode == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.suffix != ".log"}
    assert_one_line(posbench(*train, "seed=1"), "holds a finished run that has another config")
    with lock_run_dir(run):
        lock = (run / ".lock").read_bytes()
        assert_one_line(posbench(*train, "seed=2"), "another posbench process")
        assert (run / ".lock").read_bytes() == lock
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.suffix != ".log" and p.name != ".lock"}
    assert after == {p: b for p, b in before.items() if p.name != ".lock"}  # .hydra/config.yaml included


def test_three_independent_mistakes_come_back_in_one_run(posbench, assert_one_line):
    done = posbench("train", "model.n_heads=7", "encoding=rope", "encoding.theta=-1", "eval_lens=[]")
    line = assert_one_line(done, "posbench: error: 3 problems: (1) ", "(2) ", "(3) ")
    assert "model.d_model=256 is not divisible by model.n_heads=7" in line
    assert "encoding=rope: encoding.theta must be positive, got -1" in line
    assert "eval_lens=[] holds no length" in line


def test_every_command_check_collects(tmp_path):
    """eval, probe, generate and bench report every problem of their config at once, as train does."""
    from posbench.commands import command

    missing = f"checkpoint={tmp_path / 'none'}"
    commands = {
        "eval": [missing, "eval.mode=wrong"],
        "probe": [missing, "eval.mode=wrong", "probes=[]"],
        "generate": [missing, "eval.mode=wrong", "generate.top_p=0"],
        "bench": ["model.n_heads=0", "train_steps=-1", "precisions=[fp64]"],
    }
    for name, overrides in commands.items():
        command(name).register()
        with pytest.raises(PosbenchError, match=rf"^{len(overrides)} problems: \(1\) .*\({len(overrides)}\) "):
            validate_overrides(name, overrides, False)
