"""report draws the validation loss at each of train.val_lens against the step, per encoding, where runs logged it."""

import math

import pandas as pd
import pytest

from posbench.evaluate import RESULT_COLUMNS
from posbench.report import collect_runs, report
from posbench.report.val_lens import val_lens_curves

TRAIN_LEN = 4


def write_run(folder, encoding: str, seed: int, val_lens: dict[int, list[float]] | None = None) -> None:
    """A run folder of one result at train_len and validations at steps 1 and 2 (``valid_loss`` 5 + seed, 4 + seed),
    with ``valid_loss_L`` columns for ``val_lens`` (one value per step)."""
    folder.mkdir(parents=True)
    row = dict(encoding=encoding, variant="", train_len=TRAIN_LEN, train_lengths=str(TRAIN_LEN), eval_len=TRAIN_LEN)
    row.update(split="test", eval_mode="nonoverlapping", stride=TRAIN_LEN, tokens=64, unigram_ppl=25.0, seed=seed)
    row.update(params=1, encoding_params=0, run_dir=str(folder), status="ok", reason="", nll=math.log(10), ppl=10.0)
    pd.DataFrame([row], columns=RESULT_COLUMNS).to_csv(folder / "results.csv", index=False)
    log = pd.DataFrame({"step": [1, 2], "tokens": [100, 200], "valid_loss": [5.0 + seed, 4.0 + seed]})
    for length, values in (val_lens or {}).items():
        log[f"valid_loss_{length}"] = values
    log.to_csv(folder / "train_log.csv", index=False)


@pytest.fixture
def sweep(tmp_path):
    """alibi at seeds 0 and 1 logged lengths 16 and 64; rope logged none."""
    for seed in (0, 1):
        write_run(tmp_path / f"alibi_{seed}", "alibi", seed, {16: [6.0 + seed, 5.0], 64: [7.0 + seed, 8.0 + seed]})
        write_run(tmp_path / f"rope_{seed}", "rope", seed)
    return tmp_path


def test_the_curves_hold_every_length_with_train_len_s_loss_and_the_mean_over_seeds(sweep):
    curves = val_lens_curves(collect_runs(sweep).reported).set_index(["encoding", "length", "step"])["loss"]
    assert set(curves.index.get_level_values("encoding")) == {"alibi"}  # rope logged no val_lens
    assert curves[("alibi", 4, 1)] == pytest.approx(5.5)  # valid_loss at train_len 4: 5 and 6
    assert curves[("alibi", 16, 1)] == pytest.approx(6.5) and curves[("alibi", 16, 2)] == pytest.approx(5.0)
    assert curves[("alibi", 64, 2)] == pytest.approx(8.5)
    assert len(curves) == 3 * 2


def test_report_draws_them_only_where_runs_logged_them(sweep, tmp_path_factory):
    out = report(sweep)
    assert (out / "val_lens_curves.png").stat().st_size > 1000
    assert "<svg" in (out / "val_lens_curves.svg").read_text()[:1000]
    plain = tmp_path_factory.mktemp("plain")
    write_run(plain / "rope", "rope", 0)
    assert not (report(plain) / "val_lens_curves.png").exists()
