"""The report's generation section: generation.csv collected, onsets counted, measures read at multiples of
train_len, unfinished runs left out."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from posbench.evaluate import RESULT_COLUMNS
from posbench.report import report
from posbench.runfolder import GENERATION, RESULTS, RESUME_CHECKPOINT, ModelState, merge_rows, save_run_config

TRAIN_LEN = 4
WINDOW = 4


def write_run(
    folder, encoding: str, repetition, onsets: list[int | None], config: dict | None = None, lengths: str = ""
) -> None:
    """A finished run (one result row) whose samples, one per onset, have windows of 4 positions from 2 to 64
    (16 x train_len); window w (position 2 + 4w) of prompt p has repetition ``repetition(p, w)``. ``config``:
    the run's saved config (none saved: None); ``lengths``: its train_lengths (train_len alone: "")."""
    folder.mkdir(parents=True)
    model = ModelState(f"{folder.name}-run", 100, True)
    row = dict(encoding=encoding, variant="", train_len=TRAIN_LEN, train_lengths=lengths or str(TRAIN_LEN))
    row.update(eval_len=TRAIN_LEN)
    row.update(split="test", eval_mode="nonoverlapping", stride=TRAIN_LEN, tokens=64, unigram_ppl=25.0, seed=0)
    row.update(params=1, encoding_params=0, run_dir=str(folder), status="ok", reason="", nll=math.log(10), ppl=10.0)
    merge_rows(folder, RESULTS, pd.DataFrame([row], columns=RESULT_COLUMNS), model)
    if config is not None:
        save_run_config(folder, model.run_id, config)
    sampling = dict(encoding=encoding, train_len=TRAIN_LEN, variant="", precision="fp32", seed=0, temperature=1.0)
    sampling.update(top_k=0, top_p=1.0, source="test")
    rows = [
        sampling
        | dict(prompt_id=p, position=2 + WINDOW * w, tokens=min(WINDOW, 62 - WINDOW * w), repetition=repetition(p, w))
        | dict(distinct_2=1.0 - repetition(p, w), nll=4.0, degeneration_onset=onset)
        for p, onset in enumerate(onsets)
        for w in range(16)
    ]
    merge_rows(folder, GENERATION, pd.DataFrame(rows), model)


@pytest.fixture
def runs(tmp_path):
    """learned: prompt 0 loops from position 6 on (onset 6 = 1.5 x train_len), prompt 1 never; alibi never."""
    write_run(tmp_path / "learned", "learned", lambda p, w: 1.0 if p == 0 and w >= 1 else 0.1 * w / 16, [6, None])
    write_run(tmp_path / "alibi", "alibi", lambda p, w: 0.0, [None, None, None])
    return tmp_path


def test_onsets_counted_per_line_and_measures_read_where_the_window_holds_k_train_len(runs):
    out = report(runs)
    text = (out / "summary.md").read_text()
    assert "| learned |  | 4 | 1.0 | 0 | 1.0 | 1 of 2 | 1.50× | 1.50× |" in text
    assert "| alibi |  | 4 | 1.0 | 0 | 1.0 | 0 of 3 |  |  |" in text
    # position 4k - 1 lies in window w = (4k - 3) // 4: k = 1 -> w 0 (repetition 0 and 0), k = 2 -> w 1 (1 and
    # 0.1/16), k = 16 -> w 15 (1 and 1.5/16)
    section = text.split("### Generation: repeated 4-grams")[1].split("###")[0]
    learned = next(line for line in section.splitlines() if line.startswith("| learned"))
    cells = [c.strip() for c in learned.strip("|").split("|")][-5:]
    assert cells[0] == "0.000" and float(cells[1]) == pytest.approx((1 + 0.1 / 16) / 2, abs=5e-4)
    assert float(cells[4]) == pytest.approx((1 + 1.5 / 16) / 2, abs=5e-4)
    summary = pd.read_csv(out / "generation_summary.csv").set_index(["encoding", "at"])
    assert summary.loc[("alibi", 0.5), "samples"] == 3 and summary.loc[
        ("learned", 2.5), "repetition_mean"
    ] == pytest.approx((1 + 0.2 / 16) / 2)
    assert (out / "generation.png").stat().st_size > 1000 and (out / "generation.svg").is_file()


def test_an_unfinished_run_s_samples_stay_out_and_are_named(runs):
    (runs / "alibi" / RESUME_CHECKPOINT).write_bytes(b"")
    out = report(runs)
    summary = pd.read_csv(out / "generation_summary.csv")
    assert set(summary["encoding"]) == {"learned"}
    assert "`" + str(runs / "alibi") + "`: unfinished" in (out / "summary.md").read_text()


def test_samples_of_models_trained_apart_are_lines_of_their_own(tmp_path, figure_legends):
    """Two ALiBi models that differ in a result-changing key: their samples are not pooled as seeds."""
    config = dict(encoding=dict(name="alibi"), seed=0, train=dict(copy_fraction=0.0))
    write_run(tmp_path / "plain", "alibi", lambda p, w: 0.0, [None, None], config)
    write_run(tmp_path / "copies", "alibi", lambda p, w: 1.0, [4], config | dict(train=dict(copy_fraction=0.25)))
    out = report(tmp_path)
    summary = pd.read_csv(out / "generation_summary.csv", keep_default_na=False).set_index(["config", "at"])
    assert summary.loc[("train.copy_fraction=0.0", 0.5), ["samples", "repetition_mean"]].tolist() == [2, 0.0]
    assert summary.loc[("train.copy_fraction=0.25", 0.5), ["samples", "repetition_mean"]].tolist() == [1, 1.0]
    assert (
        "| alibi |  | 4 | train.copy_fraction=0.25 | 1.0 | 0 | 1.0 | 1 of 1 | 1.00× | 1.00× |"
        in (out / "summary.md").read_text()
    )
    named = figure_legends["generation.png"]  # a line per model, each named by what sets it apart
    assert len(named) == 2 and all("alibi" in n for n in named)
    assert sorted("copy_fraction=0.25" in n for n in named) == [False, True]


def test_a_model_trained_at_several_lengths_is_a_line_of_its_own_named_by_them(runs):
    write_run(runs / "alibi_mixed", "alibi", lambda p, w: 0.5, [None], lengths="2|4")
    out = report(runs)
    summary = pd.read_csv(out / "generation_summary.csv", dtype={"train_lengths": str}).set_index(
        ["train_lengths", "at"]
    )
    assert summary.loc[("2|4", 0.5), ["samples", "repetition_mean"]].tolist() == [1, 0.5]
    assert sorted(summary.loc[("4", 0.5), "samples"]) == [2, 3]  # learned's two samples, alibi's three
    assert r"| alibi |  | 4 | 2\|4 | 1.0 | 0 | 1.0 | 0 of 1 |  |  |" in (out / "summary.md").read_text()
