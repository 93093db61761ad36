"""report on bad input: non-finite or unparsable rows are left out and listed, the seed count is the
number of seeds averaged, the report is written all or nothing, a read-only folder names its path."""

from __future__ import annotations

import math
import os
import pwd
import shutil
import statistics
import tempfile
from contextlib import contextmanager
from pathlib import Path

import matplotlib.figure
import pandas as pd
import pytest

from posbench.report import REPORT_DIR, report

LENGTHS = [4, 8]
#: ppl of seed 0, 1, 2 at LENGTHS
PPL = {0: [10.0, 12.0], 1: [14.0, 13.0], 2: [11.0, 20.0]}


def write_run(root: Path, seed: int, ppl: list) -> Path:
    folder = root / f"seed={seed}"
    folder.mkdir(parents=True)
    rows = [
        dict(encoding="alibi", variant="", train_len=4, eval_len=n, split="test", eval_mode="nonoverlapping", stride=n)
        | dict(ppl=p, ppl_beyond=None, unigram_ppl=100.0, status="ok", reason="", seed=seed, run_dir=str(folder))
        for n, p in zip(LENGTHS, ppl)
    ]
    pd.DataFrame(rows).to_csv(folder / "results.csv", index=False)
    return folder


def summary_at(out: Path, eval_len: int) -> pd.Series:
    return pd.read_csv(out / "summary.csv").set_index("eval_len").loc[eval_len]


def left_out_lines(out: Path) -> list[str]:
    text = (out / "summary.md").read_text()
    return text.split("## Runs left out\n\n", 1)[1].strip().splitlines() if "## Runs left out" in text else []


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_run_with_non_finite_ppl_is_left_out_and_the_seed_count_is_the_seeds_averaged(tmp_path, bad):
    write_run(tmp_path, 0, PPL[0])
    write_run(tmp_path, 1, PPL[1])
    broken = write_run(tmp_path, 2, [bad, bad])
    out = report(tmp_path)
    for i, eval_len in enumerate(LENGTHS):
        point = summary_at(out, eval_len)
        assert point["seeds"] == 2
        assert point["ppl_mean"] == pytest.approx((PPL[0][i] + PPL[1][i]) / 2)
        assert point["ppl_std"] == pytest.approx(statistics.stdev([PPL[0][i], PPL[1][i]]))
    assert left_out_lines(out) == [f"- `{broken}`: results.csv: 2 of 2 rows left out (2 non-finite ppl)"]


@pytest.mark.parametrize("column", ["ppl", "eval_len"])
def test_rows_with_an_unparsable_number_are_left_out_and_listed(tmp_path, column):
    write_run(tmp_path, 0, PPL[0])
    garbled = write_run(tmp_path, 1, PPL[1])
    results = pd.read_csv(garbled / "results.csv")
    results[column] = results[column].astype(object)
    results.loc[1, column] = "12,5x"
    results.to_csv(garbled / "results.csv", index=False)
    write_run(tmp_path, 2, PPL[2])

    out = report(tmp_path)
    assert summary_at(out, 4)["seeds"] == 3
    assert summary_at(out, 8)["seeds"] == 2
    assert summary_at(out, 8)["ppl_mean"] == pytest.approx((PPL[0][1] + PPL[2][1]) / 2)
    assert len(pd.read_csv(out / "results.csv")) == 5
    assert left_out_lines(out) == [f"- `{garbled}`: results.csv: 1 of 2 rows left out (1 unparsable {column})"]
    assert "| alibi |  | 4 | 11.7 ± 2.1 |" in (out / "summary.md").read_text()  # train_len still an integer


@pytest.mark.parametrize("fail_at_figure", [0, 1])
@pytest.mark.parametrize("previous", [True, False])
def test_a_failure_halfway_leaves_the_previous_report_whole_and_no_temporary_folder(
    tmp_path, monkeypatch, fail_at_figure, previous
):
    write_run(tmp_path, 0, PPL[0])
    before = {}
    if previous:
        before = {p.name: p.read_bytes() for p in report(tmp_path).iterdir()}
    write_run(tmp_path, 1, PPL[1])  # the next report would differ in every table
    saved = []
    savefig = matplotlib.figure.Figure.savefig

    def failing_savefig(self, *args, **kwargs):
        if len(saved) == fail_at_figure:
            raise OSError(28, "No space left on device")
        saved.append(args)
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", failing_savefig)
    with pytest.raises(OSError, match="No space left"):
        report(tmp_path)
    after = {p.name: p.read_bytes() for p in (tmp_path / REPORT_DIR).iterdir()} if previous else {}
    assert after == before
    assert (tmp_path / REPORT_DIR).exists() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == [*([REPORT_DIR] if previous else []), "seed=0", "seed=1"]


@pytest.fixture
def world_readable_tmp():
    """A folder anyone can read (tmp_path's parents are private to the user running the tests)."""
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@contextmanager
def read_only(folder: Path):
    """``folder`` made read-only; root, whom permissions do not stop, runs the block as nobody."""
    folder.chmod(0o555)
    try:
        if os.geteuid() != 0:
            yield
            return
        os.seteuid(pwd.getpwnam("nobody").pw_uid)
        try:
            yield
        finally:
            os.seteuid(0)
    finally:
        folder.chmod(0o755)


@pytest.mark.parametrize("previous", [True, False])
def test_a_read_only_folder_is_an_os_error_naming_it(world_readable_tmp, previous):
    root = world_readable_tmp / "sweep"
    write_run(root, 0, PPL[0])
    if previous:
        report(root)
        (root / REPORT_DIR).chmod(0o777)  # writable itself: only the folder around it is read-only
    with read_only(root), pytest.raises(OSError) as e:
        report(root)
    assert type(e.value) is PermissionError and str(root) in str(e.value)
    assert (root / REPORT_DIR).exists() == previous


def test_a_report_left_half_built_is_not_read_as_a_run(tmp_path):
    write_run(tmp_path, 0, PPL[0])
    shutil.copytree(report(tmp_path), tmp_path / f".{REPORT_DIR}.killed.tmp")  # what a kill mid-report leaves
    out = report(tmp_path)
    assert len(pd.read_csv(out / "results.csv")) == len(LENGTHS)
    assert not math.isnan(summary_at(out, 4)["ppl_mean"])
    assert left_out_lines(out) == []


def test_unparsable_rows_of_the_other_csvs_are_left_out_and_listed(tmp_path):
    folder = write_run(tmp_path, 0, PPL[0])
    line = dict(encoding="alibi", variant="", train_len=4, seed=0, split="test", eval_mode="nonoverlapping", stride=8)
    positions = pd.DataFrame([dict(line, eval_len=8, position=p, nll=1.0 + p / 10, count=8) for p in range(8)])
    positions["nll"] = positions["nll"].astype(object)
    positions.loc[3, "nll"] = "oops"
    positions.to_csv(folder / "per_position.csv", index=False)
    pd.DataFrame({"step": [1, 2], "tokens": [100, "x"], "valid_loss": [5.0, 4.0]}).to_csv(folder / "train_log.csv")
    out = report(tmp_path)
    assert (out / "per_position_loss.svg").is_file() and (out / "training_curves.svg").is_file()
    assert left_out_lines(out) == [
        f"- `{folder}`: per_position.csv: 1 of 8 rows left out (1 unparsable nll); "
        "train_log.csv: 1 of 2 rows left out (1 unparsable tokens)"
    ]
