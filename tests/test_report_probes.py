"""report on runs with probe CSVs: derived numbers as mean ± std over seeds, one table and figure per probe."""

import math

import pandas as pd
import pytest

from posbench.config import EvalConfig
from posbench.evaluate import variant_of
from posbench.probes.attention import BIAS_COLUMNS
from posbench.probes.attention import COLUMNS as ATTENTION_COLUMNS
from posbench.probes.context import COLUMNS as CONTEXT_COLUMNS
from posbench.probes.copy import COLUMNS as COPY_COLUMNS
from posbench.report import report
from posbench.runfolder import ATTENTION_CSV, BIAS_CSV, CONTEXT_CSV, COPY_CSV, RESULT_COLUMNS
from posbench.runfolder import PROBE_IDENTITY as IDENTITY

L = 4  # train_len; the probes' lengths are 4, 16 and 64 (16 x L)
#: Per (encoding, seed): context nll at k = 4, 8, 16, 64; copy gain at d = 0, 16, 64; window and full nll at 64.
RUNS = {
    ("alibi", 0): ([5.0, 4.9, 4.85, 4.8], [5.0, 3.0, 1.0], (4.9, 4.8)),  # gain_beyond 0.2, effective 64, reach 16
    ("alibi", 1): ([5.0, 4.95, 4.9, 4.9], [4.0, 1.0, 0.0], (4.9, 4.9)),  # gain_beyond 0.1, effective 16, reach 0
    ("rope", 0): ([5.1, 5.2, 5.3, 5.5], [0.3, 0.3, 0.3], (5.2, 5.6)),  # no copying (a flat 0.3 nats); the window helps
}


def frame(rows: list[dict], columns: list[str], encoding: str, seed: int, variant: str = "") -> pd.DataFrame:
    identity = dict(encoding=encoding, variant=variant, train_len=L, seed=seed)
    return pd.DataFrame([{**identity, **row} for row in rows], columns=[*IDENTITY, *columns])


def write_probed_run(folder, encoding, seed, randomized_positions=None):
    """A run's results.csv and probe CSVs; ``randomized_positions``: trained at them (a variant of its rows)."""
    context_nll, gains, (window_nll, full_nll) = RUNS[encoding, seed]
    folder.mkdir(parents=True)
    trained = dict(name=encoding, randomized_positions=randomized_positions)
    variant, windowed = variant_of(trained), variant_of(trained, EvalConfig(window=L))
    results = []
    for row_variant, eval_len, nll in ((variant, L, 5.0), (variant, 16 * L, full_nll), (windowed, 16 * L, window_nll)):
        results.append(
            dict(encoding=encoding, variant=row_variant, train_len=L, eval_len=eval_len, split="test", seed=seed)
            | dict(eval_mode="nonoverlapping", stride=eval_len, tokens=99, nll=nll, ppl=math.exp(nll), status="ok")
            | dict(run_dir=str(folder), reason="")
        )
    pd.DataFrame(results, columns=RESULT_COLUMNS).to_csv(folder / "results.csv", index=False)
    context = [
        dict(split="test", context=k, subset=subset, targets=10, nll=nll + (subset != "all"), ppl=1.0, status="ok")
        for k, nll in zip([4, 8, 16, 64], context_nll)
        for subset in ("all", "repeat_far")
    ]
    frame(context, CONTEXT_COLUMNS, encoding, seed, variant).to_csv(folder / CONTEXT_CSV, index=False)
    copies = [dict(distance=d, trials=4, gain=g, status="ok") for d, g in zip([0, 16, 64], gains)]
    frame(copies, COPY_COLUMNS, encoding, seed, variant).to_csv(folder / COPY_CSV, index=False)
    anatomy = [
        dict(eval_len=m * L, layer=0, head=h, entropy=m + h + seed, mass_beyond_train_len=0.1 * h, status="ok")
        for m in (1, 4, 16)
        for h in (0, 1)
    ]
    frame(anatomy, ATTENTION_COLUMNS, encoding, seed, variant).to_csv(folder / ATTENTION_CSV, index=False)
    if encoding == "alibi":
        bias = [dict(head=h, distance=d, bias=-d / (h + 1)) for h in (0, 1) for d in (0, 1, 8, 64)]
        frame(bias, BIAS_COLUMNS, encoding, seed, variant).to_csv(folder / BIAS_CSV, index=False)


@pytest.fixture
def probed(tmp_path):
    for encoding, seed in RUNS:
        write_probed_run(tmp_path / f"{encoding}_{seed}", encoding, seed)
    return tmp_path


def test_derived_numbers_are_averaged_over_seeds(probed):
    out = report(probed)
    numbers = pd.read_csv(out / "probes.csv").set_index(["encoding", "seed"])
    assert numbers.loc[("alibi", 0), "gain_beyond"] == pytest.approx(0.2)
    assert numbers.loc[("alibi", 1), "effective_context"] == 16
    assert numbers.loc[("alibi", 0), "copy_reach"] == 16 and numbers.loc[("alibi", 1), "copy_reach"] == 0
    assert math.isnan(numbers.loc[("rope", 0), "copy_reach"])
    assert numbers.loc[("rope", 0), "window_gap"] == pytest.approx(-0.4)
    assert numbers.loc[("alibi", 0), "entropy_16x"] == pytest.approx(16.5)  # heads 0 and 1: 16 and 17
    summary = (out / "summary.md").read_text()
    std = math.sqrt(2 * 0.05**2)  # sample std of 0.2 and 0.1
    assert f"| alibi |  | 4 | 2 | 0.1500 ± {std:.4f} | 40 ± 34 |" in summary
    assert "| rope |  | 4 | 1 | -0.4000 |" in summary  # the window gap
    assert "| alibi |  | 4 | 2 | 4.500 ± 0.707 | 8 ± 11 |" in summary
    assert "| rope |  | 4 | 1 | 0.300 | no_copying |" in summary and "(gain_0 ≥ 1; `no_copying`" in summary
    for title in ("Context usage", "Window counterfactual", "Long-range copy", "Attention anatomy"):
        assert f"## {title}" in summary
    for name in ("context_usage", "copy_probe", "attention_entropy", "bias_curves"):
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.svg").is_file()


def test_runs_without_probes_have_no_probe_sections(probed):
    for folder in probed.iterdir():
        for name in (CONTEXT_CSV, COPY_CSV, ATTENTION_CSV, BIAS_CSV):
            (folder / name).unlink(missing_ok=True)
    out = report(probed)
    summary = (out / "summary.md").read_text()
    assert "## Context usage" not in summary and "## Long-range copy" not in summary
    assert "## Window counterfactual" in summary  # from the window4 rows of results.csv
    assert not (out / "context_usage.png").exists() and not (out / COPY_CSV).exists()


def test_a_run_trained_at_randomized_positions_has_probe_numbers_of_its_own(probed):
    write_probed_run(probed / "rope_randomized", "rope", 0, randomized_positions=64)
    out = report(probed)
    numbers = pd.read_csv(out / "probes.csv").fillna({"variant": ""}).set_index(["encoding", "variant"])
    assert numbers.loc[("rope", ""), "window_gap"] == pytest.approx(-0.4)
    assert numbers.loc[("rope", "randpos64"), "window_gap"] == pytest.approx(-0.4)  # its windowed rows found
    assert numbers.loc[("rope", "randpos64"), "gain_0"] == pytest.approx(0.3)
    summary = (out / "summary.md").read_text()
    assert "| rope |  | 4 | 1 | -0.4000 |" in summary and "| rope | randpos64 | 4 | 1 | -0.4000 |" in summary


def test_a_window_gap_needs_both_lengths_measured(probed):
    """A model that cannot serve 16 x train_len (learned) has no window gap, and the report is still made."""
    results = pd.read_csv(probed / "rope_0" / "results.csv")
    results.loc[results["eval_len"] == 16 * L, ["status", "nll", "ppl"]] = ["unsupported", None, None]
    results.to_csv(probed / "rope_0" / "results.csv", index=False)
    numbers = pd.read_csv(report(probed) / "probes.csv").set_index(["encoding", "seed"])
    assert math.isnan(numbers.loc[("rope", 0), "window_gap"])
    assert numbers.loc[("alibi", 0), "window_gap"] == pytest.approx(0.1)


def test_a_run_evaluated_again_keeps_the_window_gap_of_its_nonoverlapping_rows(probed):
    """Sliding-window rows of the same length and variant (the evals stage) are another measurement, not
    a second value of the gap: the gap stays the non-overlapping one and the report is made."""
    results = pd.read_csv(probed / "rope_0" / "results.csv", keep_default_na=False)
    sliding = results[results["eval_len"] == 16 * L].assign(eval_mode="sliding", stride=L, nll=[1.0, 2.0])
    scaled = results[results["variant"] == ""].assign(variant="yarn×4", nll=7.0)
    pd.concat([results, sliding, scaled]).to_csv(probed / "rope_0" / "results.csv", index=False)
    out = report(probed)
    numbers = pd.read_csv(out / "probes.csv").set_index(["encoding", "seed"])
    assert numbers.loc[("rope", 0), "window_gap"] == pytest.approx(-0.4)
    assert "| rope |  | 4 | 1 | -0.4000 |" in (out / "summary.md").read_text()


def add_copies_of_few_words(folder, encoding, seed, gains, keep_every_word=True):
    """Copy rows with spans of the 128 most frequent words (probe.vocab=128) at d = 0, 16, 64."""
    rows = [dict(distance=d, vocab=128, trials=4, gain=g, status="ok") for d, g in zip([0, 16, 64], gains)]
    few = frame(rows, COPY_COLUMNS, encoding, seed)
    every = pd.read_csv(folder / COPY_CSV) if keep_every_word else few.iloc[:0]
    pd.concat([every, few]).to_csv(folder / COPY_CSV, index=False)


def test_copy_numbers_of_a_restricted_vocabulary_stand_apart(probed):
    add_copies_of_few_words(probed / "alibi_0", "alibi", 0, [2.0, 1.8, 0.5])  # reach 16
    add_copies_of_few_words(probed / "alibi_1", "alibi", 1, [1.5, 1.0, 0.9])  # reach 64
    add_copies_of_few_words(probed / "rope_0", "rope", 0, [0.02, 0.0, 0.0], keep_every_word=False)
    out = report(probed)
    numbers = pd.read_csv(out / "probes.csv").set_index(["encoding", "seed"])
    assert numbers.loc[("alibi", 0), "gain_0"] == pytest.approx(5.0)  # the every-word rows alone
    assert numbers.loc[("alibi", 0), "copy_reach"] == 16 and numbers.loc[("alibi", 1), "copy_reach_vocab"] == 64
    assert numbers.loc[("alibi", 0), "gain_0_vocab"] == pytest.approx(2.0)
    assert numbers.loc[("rope", 0), "copy_vocab"] == 128 and math.isnan(numbers.loc[("rope", 0), "gain_0"])
    summary = (out / "summary.md").read_text()
    assert "| alibi |  | 4 | 2 | 4.500 ± 0.707 | 8 ± 11 | 128 | 1.750 ± 0.354 | 40 ± 34 |" in summary
    assert "| rope |  | 4 | 1 |  |  | 128 | 0.020 | no_copying |" in summary  # no every-word rows: blank
    assert (out / "copy_probe.png").is_file() and (out / "copy_probe_vocab128.png").stat().st_size > 1000
    copies = pd.read_csv(out / COPY_CSV)  # every run's rows, each with its run's identity
    assert len(copies) == 6 + 6 + 3 and copies.groupby(["encoding", "seed"]).size().to_dict() == {
        ("alibi", 0): 6, ("alibi", 1): 6, ("rope", 0): 3}  # fmt: skip
    few = copies[copies.vocab == 128].set_index(["encoding", "seed", "distance"])["gain"]
    assert few[("alibi", 1, 64)] == pytest.approx(0.9) and few[("rope", 0, 0)] == pytest.approx(0.02)
