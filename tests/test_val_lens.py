"""``train.val_lens``: validation loss at other lengths in train_log.csv, the same after a resume; it picks no
checkpoint and stops nothing; bad lists are one line."""

import signal

import numpy as np
import pandas as pd
import pytest

from posbench import train as train_module
from posbench.config import check_config
from posbench.errors import PosbenchError
from posbench.train import train

#: Validation every 4 steps of 10, resume state every 3.
SMALL = [
    "experiment=smoke",
    "train.steps=10",
    "train.eval_every=4",
    "train.checkpoint_every=3",
    "eval.splits=[valid]",
    "eval.max_tokens=1024",
    "train.val_tokens=512",
    "eval_lens=[32,64]",
]
VAL_LENS = "train.val_lens=[32,128,1024]"


@pytest.fixture
def small_config(compose_config, mini_data):
    def _config(*overrides: str):
        return compose_config("train", [*SMALL, f"data.path={mini_data}", *overrides])

    return _config


def interrupt_at(monkeypatch, call: int) -> None:
    """SIGTERM to this process while the ``call``-th training batch is drawn."""
    calls = {"n": 0}
    sample = train_module.sample_batch

    def sample_and_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            signal.raise_signal(signal.SIGTERM)
        return sample(*args, **kwargs)

    monkeypatch.setattr(train_module, "sample_batch", sample_and_signal)


def test_each_validation_logs_the_loss_at_every_length_and_nothing_else_changes(small_config, tmp_path):
    plain = train(small_config(), tmp_path / "plain")
    measured = train(small_config(VAL_LENS), tmp_path / "measured")
    log = pd.read_csv(tmp_path / "measured" / "train_log.csv")
    assert list(log.columns[6:10]) == ["valid_loss", "valid_loss_32", "valid_loss_128", "valid_loss_1024"]
    checks = log.dropna(subset=["valid_loss"])
    assert list(checks["step"]) == [4, 8, 10]
    assert (checks["valid_loss_32"] == checks["valid_loss"]).all()  # train_len: the same measurement
    assert checks[["valid_loss_128", "valid_loss_1024"]].notna().all().all()
    assert (checks["valid_loss_1024"] != checks["valid_loss_128"]).all()
    assert log.loc[log["valid_loss"].isna(), "valid_loss_1024"].isna().all()
    # only train_len picks the checkpoint: the same best model, the same results
    assert measured["best_valid_loss"] == plain["best_valid_loss"]
    pd.testing.assert_frame_equal(
        measured["results"].drop(columns=["run_dir", "run_id"]),
        plain["results"].drop(columns=["run_dir", "run_id"]),
        check_exact=True,
    )
    plain_log = pd.read_csv(tmp_path / "plain" / "train_log.csv")
    assert list(plain_log.columns) == [c for c in log.columns if not c.startswith("valid_loss_")]


def test_a_resumed_run_logs_the_same_columns_and_numbers(small_config, tmp_path, monkeypatch):
    train(small_config(VAL_LENS), tmp_path / "reference")
    interrupt_at(monkeypatch, call=6)  # after the validation at step 4
    with pytest.raises(PosbenchError, match="stopped by SIGTERM at step 6"):
        train(small_config(VAL_LENS), tmp_path / "run")
    monkeypatch.undo()
    train(small_config(VAL_LENS), tmp_path / "run")
    logs = [pd.read_csv(tmp_path / d / "train_log.csv").drop(columns="tokens_per_s") for d in ("reference", "run")]
    pd.testing.assert_frame_equal(*logs, check_exact=True)


def test_a_length_the_encoding_cannot_serve_is_nan(small_config, tmp_path, caplog):
    train(small_config("encoding=learned", "train.val_lens=[32,64]", "train.steps=8"), tmp_path)
    checks = pd.read_csv(tmp_path / "train_log.csv").dropna(subset=["valid_loss"])
    assert np.isnan(checks["valid_loss_64"]).all() and (checks["valid_loss_32"] == checks["valid_loss"]).all()
    assert sum("valid_loss_64 is NaN: Learned has 32 positions" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(
    "value, message",
    [
        ("[]", r"train.val_lens=\[\] holds no length"),
        ("[0,64]", "train.val_lens must hold positive integers"),
        ("[64,128,64]", r"train.val_lens must not repeat a length, got \[64, 128, 64\]"),
    ],
)
def test_bad_val_lens_are_refused(small_config, value, message):
    with pytest.raises(PosbenchError, match=message):
        check_config(small_config(f"train.val_lens={value}"))
