"""Early stopping (train.patience): a run stops after that many validations without a new best, the best
checkpoint is what gets evaluated, results.csv says where and why it stopped, and a resume keeps the count."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pandas as pd
import pytest

from posbench import train as train_module
from posbench.checkpoint import CHECKPOINT, RESUME_CHECKPOINT, load_checkpoint
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.config import check_config
from posbench.errors import PosbenchError
from posbench.report.collect import Run
from posbench.report.tables import training_curves
from posbench.runfolder import RESULTS, TRAIN_LOG
from posbench.train import train

#: A smoke run validated at every step, up to 10 steps, evaluated briefly.
SHORT = [
    "experiment=smoke",
    "train.steps=10",
    "train.eval_every=1",
    "train.checkpoint_every=2",
    "eval.splits=[valid]",
    "eval.max_tokens=1024",
    "eval_lens=[32]",
]
#: Validation loss by step: the best at step 4, then 3 checks without a better one (equal is not better).
LOSSES = {1: 5.0, 2: 4.0, 3: 4.5, 4: 3.9, 5: 3.9, 6: 4.1, 7: 3.95, 8: 3.0, 9: 2.0, 10: 1.0}


@pytest.fixture
def short_config(compose_config, mini_data):
    def _config(*overrides: str):
        return compose_config("train", [*SHORT, f"data.path={mini_data}", *overrides])

    return _config


def validation_losses(monkeypatch, losses: dict[int, float], signal_at: int | None = None) -> list[int]:
    """The real ``validate`` (best model, checkpoint.pt, patience) sees ``losses[step]`` as the validation loss;
    SIGTERM arrives during the validation at ``signal_at``. Returns the steps validated."""
    validate, steps = train_module.validate, []

    def validate_at(run, step):
        steps.append(step)
        if step == signal_at:
            signal.raise_signal(signal.SIGTERM)
        return validate(run, step)

    monkeypatch.setattr(train_module, "validate", validate_at)
    monkeypatch.setattr(train_module, "score_nonoverlapping", lambda *args: SimpleNamespace(nll=losses[steps[-1]]))
    return steps


def test_patience_stops_after_that_many_checks_and_the_best_checkpoint_is_evaluated(
    short_config, compose_config, tmp_path, monkeypatch
):
    validated = validation_losses(monkeypatch, LOSSES)
    result = train(short_config("train.patience=3"), tmp_path / "run")
    assert validated == [1, 2, 3, 4, 5, 6, 7]  # 5, 6, 7: no better than 3.9
    results = pd.read_csv(tmp_path / "run" / "results.csv")
    assert set(results["stopped_step"]) == {7} and set(results["best_step"]) == {4}
    assert set(results["stop_reason"]) == {"patience"} and set(results["train_lengths"]) == {32}
    assert result["best_valid_loss"] == 3.9 and pd.read_csv(tmp_path / "run" / "train_log.csv")["step"].max() == 7
    assert load_checkpoint(tmp_path / "run" / CHECKPOINT)["step"] == 4
    monkeypatch.undo()
    register()
    command = compose_config("eval", [f"checkpoint={tmp_path / 'run'}", "eval.splits=[valid]"])
    again = evaluate_checkpoint(command, ["checkpoint", "eval.splits"], tmp_path / "again")  # checkpoint.pt's model
    assert again["ppl"].tolist() == results["ppl"].tolist()  # not the model of step 7


def test_a_run_whose_patience_does_not_run_out_goes_to_train_steps(short_config, tmp_path, monkeypatch):
    validated = validation_losses(monkeypatch, LOSSES)
    train(short_config("train.patience=4"), tmp_path)  # 5, 6, 7 make 3; 8 is better
    assert validated == sorted(LOSSES)
    results = pd.read_csv(tmp_path / "results.csv")
    assert set(results["stop_reason"]) == {"steps"} and set(results["stopped_step"]) == {10}
    assert set(results["best_step"]) == {10}


@pytest.mark.slow
def test_resume_keeps_the_patience_count_and_a_stopped_run_stays_stopped(short_config, tmp_path, monkeypatch):
    validation_losses(monkeypatch, LOSSES, signal_at=5)
    with pytest.raises(PosbenchError, match="stopped by SIGTERM at step 5 of 10"):
        train(short_config("train.patience=3"), tmp_path / "run")
    progress = load_checkpoint(tmp_path / "run" / RESUME_CHECKPOINT)["progress"]
    assert (progress["checks_since_best"], progress["best_val"], progress["best_step"]) == (1, 3.9, 4)
    monkeypatch.undo()
    validated = validation_losses(monkeypatch, LOSSES)
    evaluate = train_module.evaluate_lengths
    killed = lambda *args, **kwargs: pytest.fail("killed before results.csv")  # noqa: E731
    monkeypatch.setattr(train_module, "evaluate_lengths", killed)
    with pytest.raises(pytest.fail.Exception):
        train(short_config("train.patience=3"), tmp_path / "run")
    assert validated == [6, 7]  # two more checks without a better loss make three: stop at 7, as before
    monkeypatch.setattr(train_module, "evaluate_lengths", evaluate)
    resumed = train(short_config("train.patience=3"), tmp_path / "run")  # from the last.pt of the stop at 7
    assert validated == [6, 7]  # nothing more trained
    stops = resumed["results"][["stopped_step", "best_step", "stop_reason"]]
    assert stops.drop_duplicates().values.tolist() == [[7, 4, "patience"]]


def test_patience_must_be_a_positive_number_of_checks(compose_config):
    with pytest.raises(PosbenchError, match=r"train.patience must be a positive number of validation checks or null"):
        check_config(compose_config("train", ["experiment=smoke", "train.patience=0"]))


def test_the_study_preset_stops_on_patience_within_eight_times_quick(compose_config):
    quick, study = (compose_config("train", [f"experiment={name}"]) for name in ("quick", "study"))
    assert study.train.steps == 8 * quick.train.steps and study.train.batch_size == quick.train.batch_size == 4
    assert study.train.patience == 5 and study.train.eval_every == 100 and study.train_len == 256
    assert quick.train.patience is None and quick.train.lengths is None  # quick trains as before


def test_training_curves_mark_each_runs_stop_and_best_step(tmp_path):
    def run(name: str, seed: int, losses: list[float], stops: dict) -> Run:
        """A run validated at steps 1, 2, ... (10 tokens a step) with these losses; ``stops`` as results.csv says."""
        results = pd.DataFrame([dict(encoding="rope", train_len=4, eval_len=4, seed=seed, **stops)])
        steps = range(1, len(losses) + 1)
        log = pd.DataFrame({"step": steps, "tokens": [10 * s for s in steps], "valid_loss": losses})
        return Run(tmp_path / name, {RESULTS: results, TRAIN_LOG: log})

    runs = [
        run("a", 0, [3.0, 2.0, 2.5], dict(stopped_step=3, best_step=2, stop_reason="patience")),
        run("b", 1, [5.0, 4.0], dict(stopped_step=2, best_step=2, stop_reason="steps")),
        run("old", 2, [4.0, 3.0, 2.0], {}),  # from before the columns: no marks
    ]
    curves, marks = training_curves(runs)
    assert curves.set_index("tokens")["valid_loss"].to_dict() == {10: 4.0, 20: 3.0, 30: 2.25}  # the seeds there
    assert marks[marks["stopped"]][["tokens", "valid_loss"]].values.tolist() == [[30, 2.5], [20, 4.0]]
    assert marks[marks["best"]][["tokens", "valid_loss"]].values.tolist() == [[20, 2.0], [20, 4.0]]


def test_a_curriculum_is_not_stopped_before_its_last_stage(short_config, tmp_path, monkeypatch):
    """Steps 1-5 train at 16, 6-10 at train_len 32: the checks of the first stage do not count, so the run
    reaches train_len and stops 3 checks after the best of its last stage."""
    losses = {1: 5.0, 2: 4.0, 3: 4.5, 4: 4.6, 5: 4.7, 6: 4.1, 7: 4.2, 8: 4.3, 9: 3.0, 10: 1.0}
    validated = validation_losses(monkeypatch, losses)
    train(short_config("train.patience=3", "train.lengths=[16,32]", "train.length_order=curriculum"), tmp_path)
    assert validated == [1, 2, 3, 4, 5, 6, 7, 8]  # random order would have stopped at 5
    results = pd.read_csv(tmp_path / "results.csv")
    assert set(results["stopped_step"]) == {8} and set(results["best_step"]) == {2}
