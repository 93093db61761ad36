"""``posbench eval``: a saved run evaluated again, merged into its results; bad input as one line."""

import pandas as pd
import pytest
import torch

from posbench.checkpoint import CHECKPOINT
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.errors import PosbenchError
from posbench.report.collect import collect_runs
from posbench.runfolder import run_configs
from posbench.saved_run import load_run


@pytest.fixture
def run(tmp_path, saved_run):
    return saved_run(tmp_path / "run")


@pytest.fixture
def evaluate(compose_config):
    """evaluate(run, overrides) as `posbench eval checkpoint=run overrides...` would, writing into run."""
    register()

    def _evaluate(run, overrides):
        command = compose_config("eval", [f"checkpoint={run}", "eval.max_tokens=600", "eval.splits=[test]", *overrides])
        keys = ["checkpoint", "eval.max_tokens", "eval.splits", *(o.split("=")[0] for o in overrides)]
        return evaluate_checkpoint(command, keys, run)

    return _evaluate


@pytest.mark.slow
def test_rows_merge_into_the_run_and_sliding_at_eval_len_matches(run, evaluate):
    evaluate(run, ["eval_lens=[32,64]"])
    evaluate(run, ["eval_lens=[32,64]", "eval.mode=sliding", "eval.stride=64"])  # at 64: nonoverlapping exactly
    evaluate(run, ["eval_lens=[64]", "rope.scaling.type=yarn", "rope.scaling.factor=4"])
    evaluate(run, ["eval_lens=[64]", "rope.scaling.type=yarn", "rope.scaling.factor=4"])  # again: replaces, not appends
    results = pd.read_csv(run / "results.csv", keep_default_na=False)
    assert len(results) == 5
    by = results.set_index(["eval_mode", "variant", "eval_len"])
    assert by.loc[("sliding", "", 64), "ppl"] == pytest.approx(by.loc[("nonoverlapping", "", 64), "ppl"], rel=1e-9)
    assert by.loc[("sliding", "", 32), "stride"] == 32  # capped at eval_len
    assert by.loc[("nonoverlapping", "yarn×4", 64), "ppl"] != pytest.approx(
        by.loc[("nonoverlapping", "", 64), "ppl"], rel=1e-6
    )
    assert set(results["tokens"]) == {599}
    positions = pd.read_csv(run / "per_position.csv", keep_default_na=False)
    for _, group in positions.groupby(["eval_mode", "variant", "eval_len"]):
        assert group["count"].sum() == 599


def test_rope_scaling_on_a_bias_encoding_is_refused(tmp_path, saved_run, evaluate):
    run = saved_run(tmp_path / "alibi", encoding="alibi")
    with pytest.raises(PosbenchError, match="rope.scaling.type applies to runs of encoding=rope; this run is alibi"):
        evaluate(run, ["rope.scaling.type=linear", "rope.scaling.factor=2"])


def test_vocabulary_mismatch_is_refused(run, evaluate, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    for split in ("train", "valid", "test"):
        (other / f"{split}.txt").write_text("a few other words here\n" * 50)
    with pytest.raises(PosbenchError, match="vocabulary"):
        evaluate(run, [f"data.path={other}"])


@pytest.mark.slow
def test_eval_command_end_to_end(run, tmp_path, posbench):

    done = posbench(
        "eval", f"checkpoint={run / CHECKPOINT}", "eval_lens=[32,64]", "eval.max_tokens=600", "eval.splits=[test]"
    )
    assert done.returncode == 0, done.stderr
    assert len(pd.read_csv(run / "results.csv")) == 2
    elsewhere = tmp_path / "elsewhere"
    done = posbench("eval", f"checkpoint={run}", "eval_lens=[32]", "eval.max_tokens=600", f"hydra.run.dir={elsewhere}")
    assert done.returncode == 0, done.stderr
    assert len(pd.read_csv(elsewhere / "results.csv")) == 2  # valid and test


def test_missing_checkpoint_is_one_line(tmp_path, compose_config):
    from posbench.commands.eval import check

    register()
    with pytest.raises(PosbenchError, match="does not exist"):
        check(compose_config("eval", [f"checkpoint={tmp_path / 'missing'}"]))
    with pytest.raises(PosbenchError, match="eval needs checkpoint=PATH"):
        check(compose_config("eval", []))
    with pytest.raises(PosbenchError, match=f"checkpoint={tmp_path}: the folder holds no {CHECKPOINT}"):
        check(compose_config("eval", [f"checkpoint={tmp_path}"]))


def test_a_length_given_twice_is_refused(run, evaluate):
    with pytest.raises(PosbenchError, match=r"eval_lens must not repeat a length, got \[64, 64, 64\]"):
        evaluate(run, ["eval_lens=[64,64,64]"])


@pytest.mark.slow
def test_a_sweep_over_checkpoints_evaluates_each_into_its_own_run(tmp_path, saved_run, posbench):
    first, second = saved_run(tmp_path / "a"), saved_run(tmp_path / "b", encoding="alibi")
    done = posbench(
        "-m", "eval", f"checkpoint={first},{second}", "eval_lens=[32]", "eval.max_tokens=600", "eval.splits=[test]",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert ": 2 finished, 0 failed" in done.stderr
    for run, encoding in ((first, "rope"), (second, "alibi")):
        results = pd.read_csv(run / "results.csv")
        assert list(results["encoding"]) == [encoding] and list(results["eval_len"]) == [32]
        assert (run / ".hydra" / "eval" / "config.yaml").is_file()
        assert f"posbench eval checkpoint={run} eval_lens=[32]" in (run / "eval.log").read_text()  # what it was asked


def test_a_run_measured_last_with_a_variant_is_still_averaged_with_its_seeds(tmp_path, saved_run, evaluate):
    # the folder keeps the config the run was trained with: a RoPE scaling or log-n measured last must not
    # set the run apart from another seed of its line (the rows name their variant themselves)
    plain, extended = saved_run(tmp_path / "runs" / "a"), saved_run(tmp_path / "runs" / "b")
    evaluate(plain, ["eval_lens=[64]"])
    evaluate(extended, ["eval_lens=[64]"])
    evaluate(extended, ["eval_lens=[64]", "rope.scaling.type=yarn", "rope.scaling.factor=4", "model.logn_scaling=true"])
    for run in (plain, extended):
        (config,) = run_configs(run).values()
        assert config["encoding"]["scaling"]["type"] is None and config["model"]["logn_scaling"] is False
    runs = collect_runs(tmp_path / "runs").reported
    assert len(runs) == 2 and {run.config for run in runs} == {""}


def test_the_model_as_trained_is_the_saved_one_without_the_commands_encoding_options(run, compose_config):
    # a RoPE scaling changes the model itself: the model as trained (by which a task run is judged) has none
    register()
    x = torch.arange(48)[None]

    def loaded(*overrides):
        command = compose_config("eval", [f"checkpoint={run}", *overrides])
        return load_run(command, ["checkpoint", *(o.split("=")[0] for o in overrides)])

    plain, scaled = loaded(), loaded("rope.scaling.type=linear", "rope.scaling.factor=4")
    assert plain.as_trained() is plain.model
    assert scaled.as_trained() is not scaled.model
    with torch.no_grad():
        assert not torch.allclose(scaled.model(x), plain.model(x))
        assert torch.equal(scaled.as_trained()(x), plain.model(x))
