"""report compare=ENCODING: paired differences in NLL per token with article-bootstrap CIs."""

import math

import numpy as np
import pandas as pd
import pytest

from posbench.cli import main
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.errors import PosbenchError
from posbench.evaluate import variant_of
from posbench.report import REPORT_DIR, report
from posbench.report.compare import REPLICATES, compare_encodings
from posbench.runfolder import PER_ARTICLE, PER_ARTICLE_COLUMNS, RESULT_COLUMNS

MEASUREMENT = dict(variant="", train_len=16, precision="fp32", split="test", eval_mode="nonoverlapping")
MEASUREMENT.update(stride=64, eval_len=64, train_lengths="16")


def synthetic(delta: float, rng: np.random.Generator, seeds=(0, 1, 2), n_articles: int = 60) -> pd.DataFrame:
    """per_article rows of "model" and "reference" on the same articles: per-token NLL of each article
    = its difficulty (shared) + noise of each model and seed, plus ``delta`` for "model"."""
    tokens = rng.integers(100, 2000, n_articles)
    difficulty = rng.normal(5.0, 0.5, n_articles)
    rows = []
    for seed in seeds:
        for encoding, shift in (("model", delta), ("reference", 0.0)):
            mean_nll = difficulty + shift + rng.normal(0.0, 0.05, n_articles)
            rows += [
                dict(MEASUREMENT, encoding=encoding, seed=seed, article=a, tokens=t, nll_sum=t * m)
                for a, (t, m) in enumerate(zip(tokens, mean_nll))
            ]
    return pd.DataFrame(rows)


def by_seed(frame: pd.DataFrame, encoding: str) -> list[pd.DataFrame]:
    rows = frame[frame["encoding"] == encoding].sort_values(["seed", "article"])
    return [group for _, group in rows.groupby("seed")]


def independent_bootstrap(frame: pd.DataFrame, replicates: int, seed: int) -> np.ndarray:
    """The method written out plainly: per replicate and seed, draw articles with replacement, take each
    model's token-weighted mean NLL on the draw, subtract; average the seeds; 2.5 and 97.5 percentiles."""
    rng = np.random.default_rng(seed)
    seeds = list(zip(by_seed(frame, "model"), by_seed(frame, "reference")))
    statistics = []
    for _ in range(replicates):
        differences = []
        for model, reference in seeds:
            pick = rng.choice(len(model), size=len(model), replace=True)
            mean_model = model["nll_sum"].to_numpy()[pick].sum() / model["tokens"].to_numpy()[pick].sum()
            mean_reference = reference["nll_sum"].to_numpy()[pick].sum() / reference["tokens"].to_numpy()[pick].sum()
            differences.append(mean_model - mean_reference)
        statistics.append(np.mean(differences))
    return np.percentile(statistics, [2.5, 97.5])


def test_delta_and_ci_against_an_independent_computation():
    frame = synthetic(0.03, np.random.default_rng(1))
    row = compare_encodings(frame, "reference").iloc[0]
    per_seed = [
        m["nll_sum"].sum() / m["tokens"].sum() - r["nll_sum"].sum() / r["tokens"].sum()
        for m, r in zip(by_seed(frame, "model"), by_seed(frame, "reference"))
    ]
    assert row["delta_nll"] == pytest.approx(np.mean(per_seed), rel=1e-12)
    assert row["ppl_ratio"] == pytest.approx(math.exp(np.mean(per_seed)), rel=1e-12)
    assert (row["seeds"], row["unpaired_seeds"], row["articles"]) == (3, 0, 60)
    low, high = independent_bootstrap(frame, REPLICATES, seed=12345)  # another generator: Monte Carlo error only
    width = high - low
    assert row["ci_low"] == pytest.approx(low, abs=0.1 * width)
    assert row["ci_high"] == pytest.approx(high, abs=0.1 * width)
    # pairing: the width reflects the models' noise (0.05 per article), not the articles' difficulty (0.5)
    assert width < 0.02


@pytest.mark.parametrize("delta", [0.0, 0.01])
def test_ci_covers_the_true_difference(delta):
    rng = np.random.default_rng(7)
    rows = pd.concat([compare_encodings(synthetic(delta, rng), "reference") for _ in range(100)])
    coverage = ((rows["ci_low"] <= delta) & (delta <= rows["ci_high"])).mean()
    assert 0.88 <= coverage <= 0.99  # 95% nominal; a CI far too wide or too narrow fails
    if delta == 0:
        assert (~rows["ci_excludes_zero"].astype(bool)).mean() == coverage


def test_a_large_difference_excludes_zero_and_none_includes_it():
    rng = np.random.default_rng(3)
    large, none = (compare_encodings(synthetic(delta, rng), "reference").iloc[0] for delta in (0.1, 0.0))
    assert large["ci_low"] > 0 and large["ci_excludes_zero"]
    assert none["ci_low"] < 0 < none["ci_high"] and not none["ci_excludes_zero"]


def test_only_seeds_scored_alike_by_both_are_paired():
    frame = synthetic(0.05, np.random.default_rng(4), seeds=(0, 1, 2, 3))
    frame = frame[~((frame["encoding"] == "reference") & (frame["seed"] == 3))]  # seed 3: the model's only
    other_tokens = (frame["encoding"] == "model") & (frame["seed"] == 2) & (frame["article"] == 0)
    frame.loc[other_tokens, "tokens"] += 1  # seed 2: not the same tokens
    row = compare_encodings(frame, "reference").iloc[0]
    assert (row["seeds"], row["unpaired_seeds"]) == (2, 2)
    paired = frame[frame["seed"] < 2]
    per_seed = [
        m["nll_sum"].sum() / m["tokens"].sum() - r["nll_sum"].sum() / r["tokens"].sum()
        for m, r in zip(by_seed(paired, "model"), by_seed(paired, "reference"))
    ]
    assert row["delta_nll"] == pytest.approx(np.mean(per_seed), rel=1e-12)


def test_one_article_gives_no_ci():
    row = compare_encodings(synthetic(0.05, np.random.default_rng(5), n_articles=1), "reference").iloc[0]
    assert row["seeds"] == 3 and math.isnan(row["ci_low"]) and pd.isna(row["ci_excludes_zero"])


def write_run(folder, per_article: pd.DataFrame | None, encoding: str, seed: int = 0, variant: str = "") -> None:
    folder.mkdir(parents=True)
    row = dict(MEASUREMENT, encoding=encoding, variant=variant, seed=seed, tokens=10, nll=1.0, ppl=math.e, status="ok")
    pd.DataFrame([dict(row, run_dir=str(folder))], columns=RESULT_COLUMNS).to_csv(folder / "results.csv", index=False)
    if per_article is not None:
        rows = per_article.assign(encoding=encoding, variant=variant, seed=seed)
        rows[PER_ARTICLE_COLUMNS].to_csv(folder / PER_ARTICLE, index=False)


@pytest.fixture
def articles():
    return synthetic(0.0, np.random.default_rng(6), seeds=(0,)).query("encoding == 'model'")


def test_a_reference_not_in_the_folder_is_one_line(tmp_path, articles):
    write_run(tmp_path / "a", articles, "alibi")
    with pytest.raises(PosbenchError, match="compare=rope: no run of encoding rope under .*; runs there: alibi"):
        report(tmp_path, compare="rope")


def test_runs_without_per_article_are_one_line(tmp_path, articles):
    write_run(tmp_path / "a", None, "alibi")
    write_run(tmp_path / "r", None, "rope")
    with pytest.raises(PosbenchError, match="compare=rope needs per-article NLL .* no run under"):
        report(tmp_path, compare="rope")
    write_run(tmp_path / "a2", articles, "alibi", seed=1)
    with pytest.raises(PosbenchError, match="the runs of rope under .* have no per-article NLL"):
        report(tmp_path, compare="rope")
    assert not (tmp_path / REPORT_DIR).exists()


def test_two_runs_of_one_seed_are_one_line(tmp_path, articles):
    write_run(tmp_path / "r", articles, "rope")
    write_run(tmp_path / "a", articles, "alibi")
    write_run(tmp_path / "a_again", articles, "alibi")
    with pytest.raises(PosbenchError, match="alibi .*seed 0 was measured alike in two runs"):
        report(tmp_path, compare="rope")


def test_a_run_trained_at_randomized_positions_is_compared_as_a_model_of_its_own(tmp_path, articles):
    write_run(tmp_path / "a", articles, "alibi")
    write_run(tmp_path / "r", articles, "rope")
    write_run(
        tmp_path / "r_randomized", articles, "rope", variant=variant_of({"name": "rope", "randomized_positions": 64})
    )
    compare = pd.read_csv(report(tmp_path, compare="alibi") / "compare.csv").fillna({"variant": ""})
    assert sorted(zip(compare["encoding"], compare["variant"], compare["seeds"])) == [
        ("rope", "", 1),
        ("rope", "randpos64", 1),
    ]


@pytest.mark.slow
def test_report_compare_end_to_end(tmp_path, saved_run, compose_config, capsys):
    """Two untrained smoke models evaluated by `posbench eval`, then `posbench report DIR compare=rope`."""
    register()
    for encoding in ("rope", "alibi"):
        run = saved_run(tmp_path / encoding, encoding=encoding)
        overrides = [f"checkpoint={run}", "eval.max_tokens=6000", "eval.splits=[test]", "eval_lens=[32,64]"]
        evaluate_checkpoint(compose_config("eval", overrides), [o.split("=")[0] for o in overrides], run)
    assert main(["report", str(tmp_path), "compare=rope"]) == 0
    compare = pd.read_csv(tmp_path / REPORT_DIR / "compare.csv").set_index("eval_len")
    results = pd.read_csv(tmp_path / REPORT_DIR / "results.csv").pivot(index="eval_len", columns="encoding")
    assert list(compare.index) == [32, 64] and set(compare["encoding"]) == {"alibi"}
    assert (compare["seeds"] == 1).all() and (compare["articles"] == 3).all()  # the first 6000 tokens: 3 articles
    difference = results["nll"]["alibi"] - results["nll"]["rope"]
    assert compare["delta_nll"].tolist() == pytest.approx(difference.tolist(), rel=1e-9)
    assert ((compare["ci_low"] <= compare["delta_nll"]) & (compare["delta_nll"] <= compare["ci_high"])).all()
    assert "## Paired comparison against rope" in (tmp_path / REPORT_DIR / "summary.md").read_text()
    capsys.readouterr()
    for wrong in ("compare=t5", "against=rope"):
        with pytest.raises(SystemExit, match="2"):
            main(["report", str(tmp_path), wrong])
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[0].startswith("posbench: error: compare=t5: no run of encoding t5") and len(errors) == 2
    words = "compare=ENCODING, variants=LIST, modes=LIST"
    assert errors[1] == f"posbench: error: report takes DIR and {words}, not 'against=rope'"
