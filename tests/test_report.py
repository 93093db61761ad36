"""report on a fixture folder of 2 encodings x 2 seeds: means, sample stds, tables, figures."""

import math
import shutil

import pandas as pd
import pytest
from matplotlib import colormaps
from matplotlib.colors import to_hex

from posbench.cli import main
from posbench.errors import PosbenchError
from posbench.evaluate import variant_of
from posbench.positional import ENCODINGS
from posbench.report import REPORT_DIR, Selection, collect_runs, report
from posbench.report.collect import RUN_CSVS
from posbench.report.figures import (
    ENCODING_COLOURS,
    draw_figures,
    encoding_colours,
    length_ratio_curves,
    line_styles,
)
from posbench.report.tables import aggregate, change, mean_std, normalise, signed, training_curves
from posbench.runfolder import PER_POSITION, PER_POSITION_COLUMNS, RESULT_COLUMNS, RESULTS

TRAIN_LEN, LENGTHS = 4, [4, 8, 16]
# ppl by (encoding, seed) at each length; "learned" cannot serve 16
PPL = {
    ("alibi", 0): [10.0, 11.0, 12.0],
    ("alibi", 1): [14.0, 13.0, 12.0],
    ("learned", 0): [20.0, 40.0, None],
    ("learned", 1): [22.0, 50.0, None],
}
UNIGRAM = 25.0


def write_run(folder, encoding, seed, eval_mode="nonoverlapping", variant="", train_len=TRAIN_LEN):
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for eval_len, ppl in zip(LENGTHS, PPL[encoding, seed]):
        stride = eval_len if eval_mode == "nonoverlapping" else 2
        row = dict(encoding=encoding, variant=variant, train_len=train_len, eval_len=eval_len, split="test")
        row.update(train_lengths=str(train_len))
        row.update(eval_mode=eval_mode, stride=stride, tokens=64, unigram_ppl=UNIGRAM, seed=seed, params=1)
        row.update(encoding_params=0, run_dir=str(folder), reason="")
        if ppl is None:
            row.update(status="unsupported", reason="too long")
        else:
            row.update(status="ok", nll=math.log(ppl), ppl=ppl, ppl_beyond=ppl + 1 if eval_len > train_len else None)
        rows.append(row)
    pd.DataFrame(rows, columns=RESULT_COLUMNS).to_csv(folder / "results.csv", index=False)
    line = dict(encoding=encoding, variant=variant, train_len=train_len, seed=seed, split="test", eval_mode=eval_mode)
    positions = [dict(line, stride=8, eval_len=8, position=p, nll=1.0 + seed + p / 10, count=8) for p in range(8)]
    pd.DataFrame(positions, columns=PER_POSITION_COLUMNS).to_csv(folder / PER_POSITION, index=False)
    train_log = pd.DataFrame({"step": [1, 2], "tokens": [100, 200], "valid_loss": [5.0 + seed, 4.0 + seed]})
    train_log.to_csv(folder / "train_log.csv", index=False)


@pytest.fixture
def sweep(tmp_path):
    for i, (encoding, seed) in enumerate(PPL):
        write_run(tmp_path / f"{i}_{encoding}_{seed}", encoding, seed)
    return tmp_path


def test_means_and_sample_stds_across_seeds(sweep):
    out = report(sweep)
    summary = pd.read_csv(out / "summary.csv").set_index(["encoding", "eval_len"])
    assert summary.loc[("alibi", 4), "ppl_mean"] == pytest.approx(12.0)
    assert summary.loc[("alibi", 4), "ppl_std"] == pytest.approx(math.sqrt(8))  # (10, 14): sample std 2*sqrt(2)
    assert summary.loc[("alibi", 16), "ppl_std"] == pytest.approx(0.0)
    assert summary.loc[("learned", 8), "ppl_mean"] == pytest.approx(45.0)
    assert summary.loc[("learned", 8), "ppl_std"] == pytest.approx(math.sqrt(50))
    assert summary.loc[("alibi", 8), "ppl_beyond_mean"] == pytest.approx(13.0)
    assert summary.loc[("alibi", 4), "seeds"] == 2
    assert summary.loc[("learned", 16), "status"] == "unsupported"
    assert len(pd.read_csv(out / "results.csv")) == 12


def test_summary_markdown(sweep):
    text = (report(sweep) / "summary.md").read_text()
    assert "| alibi |  | 4 | 12.0 ± 2.8 | 12.0 ± 1.4 (+0.0%) | 12.0 ± 0.0 (+0.0%) | 25.0 |" in text
    assert "| learned |  | 4 | 21.0 ± 1.4 | 45.0 ± 7.1 (+114.3%) | unsupported | 25.0 |" in text
    # learned at its training length (21) is within 80% of the unigram 25; alibi (12) is not
    assert "**learned (train 4)**" in text and "**alibi (train 4)**" not in text


def test_figures_png_and_svg(sweep):
    out = report(sweep)
    for name in ("ppl_vs_length", "per_position_loss", "training_curves"):
        assert (out / f"{name}.png").stat().st_size > 1000
        assert "<svg" in (out / f"{name}.svg").read_text()[:1000]


def test_figures_are_drawn_from_what_collect_read(sweep, tmp_path_factory):
    runs = collect_runs(sweep)
    results = normalise(runs.rows(RESULTS))
    shutil.rmtree(sweep)  # nothing left on disk to read
    out = tmp_path_factory.mktemp("figures")
    draw_figures(runs, results, aggregate(results), "test", out)
    assert sorted(p.stem for p in out.glob("*.svg")) == ["per_position_loss", "ppl_vs_length", "training_curves"]


def test_collect_reads_one_more_csv_named_in_its_table(sweep, monkeypatch):
    """How a probe's CSV joins the report: one entry (file name: numeric columns) in RUN_CSVS."""
    monkeypatch.setitem(RUN_CSVS, "copy_probe.csv", ("accuracy",))
    probe = sweep / "0_alibi_0" / "copy_probe.csv"
    pd.DataFrame({"encoding": ["alibi", "alibi"], "accuracy": ["0.5", "high"]}).to_csv(probe, index=False)
    runs = collect_runs(sweep)
    assert runs.rows("copy_probe.csv")["accuracy"].tolist() == [0.5]
    assert runs.left_out == {probe.parent: "copy_probe.csv: 1 of 2 rows left out (1 unparsable accuracy)"}


def test_a_panel_per_eval_mode_and_variants_as_lines(sweep):
    write_run(sweep / "4_alibi_sliding", "alibi", 0, eval_mode="sliding")
    write_run(sweep / "5_alibi_variant", "alibi", 0, variant="yarn×4")
    out = report(sweep)
    summary = pd.read_csv(out / "summary.csv", keep_default_na=False)
    assert set(summary["eval_mode"]) == {"nonoverlapping", "sliding"}
    assert set(summary["variant"]) == {"", "yarn×4"}
    text = (out / "summary.md").read_text()
    assert "## test perplexity, sliding (stride 2)" in text
    assert "| alibi | yarn×4 | 4 | 10.0 |" in text


def test_report_dir_is_not_read_back(sweep):
    report(sweep)
    out = report(sweep)  # the first report's results.csv must not count as a run
    assert len(pd.read_csv(out / "results.csv")) == 12
    assert not (out / REPORT_DIR).exists()


def test_an_encoding_keeps_its_colour_whatever_else_is_plotted():
    """per_position_loss.png lacks encodings that cannot serve the longest length; colours must not shift."""
    keys = [("alibi", "", 256), ("learned", "", 256), ("rope", "", 256), ("rope", "yarn×4", 256)]
    every = line_styles(keys, encoding_colours(["alibi", "learned", "rope"]))
    fewer = line_styles([("alibi", "", 256), ("rope", "", 256)], encoding_colours(["alibi", "rope"]))
    rope, rope_yarn = every[("rope", "", 256)], every[("rope", "yarn×4", 256)]
    assert rope["color"] == fewer[("rope", "", 256)]["color"] == rope_yarn["color"]
    assert rope["linestyle"] != rope_yarn["linestyle"]
    assert len(set(encoding_colours(ENCODINGS).values())) == len(ENCODINGS)


def test_the_ten_encodings_keep_their_tab10_colours():
    tab10 = [to_hex(c) for c in colormaps["tab10"].colors]
    names = ["alibi", "rope", "sinusoidal", "learned", "none", "t5", "kerple_log", "kerple_power", "fire", "xpos"]
    assert encoding_colours(names) == dict(zip(names, tab10)) == ENCODING_COLOURS


@pytest.mark.parametrize("count", [1, 10, 11, 40])
def test_unknown_encodings_get_colours_no_other_encoding_has(count):
    unknown = [f"mine{i}" for i in range(count)]
    colours = encoding_colours([*ENCODING_COLOURS, *unknown])
    assert [colours[name] for name in ENCODING_COLOURS] == list(ENCODING_COLOURS.values())
    assert len(set(colours.values())) == len(ENCODING_COLOURS) + count
    assert encoding_colours(["alibi", "mine0"])["mine0"] != ENCODING_COLOURS["alibi"]  # tab10 by index gave alibi's


def test_variants_in_numeric_order(sweep):
    for i, variant in enumerate(["linear×16", "linear×4", "linear×2"]):
        write_run(sweep / f"{6 + i}_alibi_{variant}", "alibi", 0, variant=variant)
    text = (report(sweep) / "summary.md").read_text()
    rows = [text.index(f"| alibi | linear×{factor} | 4 |") for factor in (2, 4, 16)]
    assert rows == sorted(rows)  # as strings ×16 would come before ×2 and ×4
    styles = line_styles([("alibi", "linear×16", 4), ("alibi", "linear×4", 4)], encoding_colours(["alibi"]))
    assert [k[1] for k in styles] == ["linear×4", "linear×16"]


def test_a_training_length_axis_puts_eval_len_over_train_len_on_x(sweep):
    """alibi trained at 4 and 8: a panel for alibi with one line per train_len against eval_len / train_len;
    learned, trained at 4 only, and alibi's variant have none."""
    write_run(sweep / "6_alibi_8", "alibi", 0, train_len=8)
    write_run(sweep / "7_alibi_8_variant", "alibi", 0, train_len=8, variant="yarn×4")
    out = report(sweep)
    assert (out / "ppl_vs_length_ratio.png").stat().st_size > 1000
    curves = length_ratio_curves(aggregate(normalise(collect_runs(sweep).rows(RESULTS))), "test")
    assert set(curves["encoding"]) == {"alibi"}
    by_length = {n: sorted(g["ratio"]) for n, g in curves.groupby("train_len")}
    assert by_length == {4: [1.0, 2.0, 4.0], 8: [0.5, 1.0, 2.0]}
    # at train_len 8, ratio 0.5 is eval_len 4: seed 0's 10.0 alone (no yarn row mixed in)
    row = curves[(curves["train_len"] == 8) & (curves["ratio"] == 0.5)]
    assert row["ppl_mean"].tolist() == [10.0]


def test_a_run_trained_at_randomized_positions_is_a_line_of_its_own(sweep):
    randomized = variant_of({"name": "alibi", "randomized_positions": 64})
    write_run(sweep / "4_alibi_randpos", "alibi", 1, variant=randomized)
    out = report(sweep)
    summary = pd.read_csv(out / "summary.csv").fillna({"variant": ""}).set_index(["encoding", "variant", "eval_len"])
    assert summary.loc[("alibi", "", 4), "seeds"] == 2 and summary.loc[("alibi", "", 4), "ppl_mean"] == 12.0
    assert summary.loc[("alibi", "randpos64", 4), "seeds"] == 1
    assert summary.loc[("alibi", "randpos64", 4), "ppl_mean"] == 14.0  # seed 1's, not averaged with the plain run
    assert "| alibi | randpos64 | 4 | 14.0 |" in (out / "summary.md").read_text()
    curves, _ = training_curves(collect_runs(sweep).reported)
    losses = curves[curves["encoding"] == "alibi"].set_index(["variant", "tokens"])["valid_loss"]
    assert losses.to_dict() == {("", 100): 5.5, ("", 200): 4.5, ("randpos64", 100): 6.0, ("randpos64", 200): 5.0}


def test_cells_group_thousands_and_write_a_typographic_minus():
    assert mean_std(1234.56, 7.89) == "1,234.6 ± 7.9"
    assert mean_std(12.0, float("nan")) == "12.0"  # one seed: no spread to show
    assert mean_std(float("nan"), 1.0) == ""
    assert change(190.0, 200.0) == " (−5.0%)"  # U+2212, not a hyphen
    assert change(4000.0, 200.0) == " (+1,900.0%)"
    assert signed(-0.00004, 3) == "+0.000"  # rounds to zero: no minus


def test_a_selection_keeps_the_variants_and_modes_named_in_every_file(sweep):
    """`report DIR variants=window4 modes=nonoverlapping`: the models as trained, their window rows, no others."""
    write_run(sweep / "4_alibi_window", "alibi", 0, variant="window4")
    write_run(sweep / "5_alibi_yarn", "alibi", 0, variant="yarn×4")
    write_run(sweep / "6_alibi_sliding", "alibi", 0, eval_mode="sliding")
    randomized = variant_of({"name": "alibi", "randomized_positions": 64})
    write_run(sweep / "7_randpos", "alibi", 1, variant=randomized)  # how it was trained: kept
    write_run(sweep / "8_randpos_yarn", "alibi", 1, variant=f"{randomized}+yarn×4")
    out = report(sweep, selection=Selection(variants=("window4",), modes=("nonoverlapping",)))
    for name in ("results.csv", "summary.csv"):
        table = pd.read_csv(out / name, keep_default_na=False)
        assert set(table["variant"]) == {"", "window4", "randpos64"} and set(table["eval_mode"]) == {"nonoverlapping"}
    runs = pd.read_csv(out / "results.csv")["run_dir"].map(lambda d: d.rsplit("/", 1)[-1])
    assert set(runs) == {"0_alibi_0", "1_alibi_1", "2_learned_0", "3_learned_1", "4_alibi_window", "7_randpos"}
    positions = collect_runs(sweep, Selection(variants=(), modes=("nonoverlapping",))).rows(PER_POSITION)
    assert set(positions["variant"].fillna("")) == {"", "randpos64"}  # variants=: the models as trained only
    assert len(pd.read_csv(report(sweep) / "results.csv")) == 12 + 5 * 3  # no selection: every row


def test_a_selection_names_only_what_was_measured(sweep):
    write_run(sweep / "4_alibi_window", "alibi", 0, variant="window4")
    with pytest.raises(PosbenchError, match=r"^variants=windw4: no run has it; the runs' variants: window4$"):
        report(sweep, selection=Selection(variants=("window4", "windw4")))
    with pytest.raises(PosbenchError, match=r"^modes=slide: no such eval mode; the modes are nonoverlapping, sliding$"):
        Selection(modes=("slide",))
    with pytest.raises(PosbenchError, match=r"^no results under .* that modes=sliding keeps$"):
        report(sweep, selection=Selection(modes=("sliding",)))


def test_the_command_line_hands_its_selection_to_the_report(sweep):
    write_run(sweep / "4_alibi_sliding", "alibi", 0, eval_mode="sliding")
    write_run(sweep / "5_alibi_yarn", "alibi", 0, variant="yarn×4")
    assert main(["report", str(sweep), "variants=", "modes=sliding"]) == 0
    results = pd.read_csv(sweep / REPORT_DIR / "results.csv", keep_default_na=False)
    assert set(results["eval_mode"]) == {"sliding"} and set(results["variant"]) == {""} and len(results) == 3
