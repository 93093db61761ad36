"""Paired comparisons (``report DIR compare=ENCODING``): each model's mean NLL per token minus a reference
encoding's on the same tokens, with a bootstrap confidence interval over the split's articles.

For a seed s that both have (paired by seed number), articles a with t_a scored targets and summed NLL x_a
(the model) and y_a (the reference): delta_s = sum_a (x_a - y_a) / sum_a t_a, and delta = mean_s delta_s. A
bootstrap replicate draws, for every seed, as many of its articles as it has, with replacement, the same draw for
both models, and averages the seeds' deltas on the draws; the CI is the middle CONFIDENCE of REPLICATES
replicates. Every comparison draws from its own generator seeded BOOTSTRAP_SEED, so a row does not change when
other runs are added to the folder.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..errors import PosbenchError
from ..markdown import markdown_table
from ..runfolder import PER_ARTICLE
from .collect import RESULTS, Runs
from .tables import at_train_len_alone, eval_modes, label, mode_title, natural_key, normalise, splits

REPLICATES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
#: A model is compared with the reference's model as trained measured alike: same columns but encoding, variant
#: and train_lengths (the reference trained at its train_len alone).
MEASUREMENT = ["train_len", "precision", "split", "eval_mode", "stride", "eval_len"]
MODEL = ["encoding", "variant", "train_lengths", "config", *MEASUREMENT]
COMPARE_COLUMNS = [
    "reference",
    *MODEL,
    "seeds",
    "unpaired_seeds",
    "articles",
    "nll",
    "reference_nll",
    "delta_nll",
    "ppl_ratio",
    "ci_low",
    "ci_high",
    "ci_excludes_zero",
]
HOW_TO_WRITE = "write it with `posbench eval checkpoint=RUN`"


class SeedPair(NamedTuple):
    """One seed's articles, scored by the model and by the reference: (articles,) arrays."""

    tokens: np.ndarray
    nll_sum: np.ndarray
    reference_nll_sum: np.ndarray


def compare_runs(runs: Runs, reference: str, root: Path) -> pd.DataFrame:
    """compare.csv of the runs below ``root`` (``compare_encodings``); one line if it cannot be made."""
    articles = article_rows(runs)
    check_reference(articles, reference, runs, root)
    check_one_run_per_seed(articles)
    return compare_encodings(articles, reference)


def compare_encodings(articles: pd.DataFrame, reference: str) -> pd.DataFrame:
    """One row per model and measurement that ``reference`` as trained shares (COMPARE_COLUMNS), from
    per_article.csv rows on one footing."""
    is_reference = as_trained(articles, reference)
    reference_at = dict(iter(articles[is_reference].groupby(MEASUREMENT)))
    rows, model_keys = [], model_columns(articles)
    for key, model in articles[~is_reference].groupby(model_keys):
        measured = key[-len(MEASUREMENT) :]
        if measured in reference_at:
            pairs, unpaired = paired_seeds(model, reference_at[measured])
            row = dict(zip(model_keys, key), reference=reference, seeds=len(pairs), unpaired_seeds=unpaired)
            rows.append({**row, **paired_delta(pairs)})
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS).astype({"articles": "Int64"})  # empty without pairs


def model_columns(articles: pd.DataFrame) -> list[str]:
    """The MODEL columns ``articles`` has (rows built by hand may have no config)."""
    return [c for c in MODEL if c in articles]


def as_trained(articles: pd.DataFrame, reference: str) -> pd.Series:
    """The rows of ``reference`` as trained: no evaluation-time variant, trained at its train_len alone."""
    return (articles["encoding"] == reference) & (articles["variant"] == "") & at_train_len_alone(articles)


def article_rows(runs: Runs) -> pd.DataFrame:
    """The rows of every run's per_article.csv, with the run's folder and training lengths, on one footing
    (``normalise``)."""
    frames = [
        run.tables[PER_ARTICLE].assign(run_dir=str(run.folder), train_lengths=run.train_lengths, config=run.config)
        for run in runs.reported
        if PER_ARTICLE in run.tables
    ]
    return normalise(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()


def check_reference(articles: pd.DataFrame, reference: str, runs: Runs, root: Path) -> None:
    """One line when the reference has nothing to compare against."""
    if articles.empty:
        raise PosbenchError(
            f"compare={reference} needs per-article NLL (per_article.csv), which no run under {root} has; "
            f"{HOW_TO_WRITE} for each run"
        )
    encodings = sorted(set(runs.rows(RESULTS)["encoding"]))
    if reference not in encodings:
        raise PosbenchError(
            f"compare={reference}: no run of encoding {reference} under {root}; runs there: {', '.join(encodings)}"
        )
    if not as_trained(articles, reference).any():
        raise PosbenchError(
            f"compare={reference}: the runs of {reference} under {root} have no per-article NLL of the model as "
            f"trained (per_article.csv); {HOW_TO_WRITE}"
        )


def check_one_run_per_seed(articles: pd.DataFrame) -> None:
    """Pairing by seed needs one measurement per seed: two runs of the same model and seed stop in one line."""
    folders = articles.groupby([*model_columns(articles), "seed"])["run_dir"].unique()
    doubled = folders[folders.map(len) > 1]
    if len(doubled):
        key, (first, second, *_) = next(iter(doubled.items()))
        model = dict(zip([*model_columns(articles), "seed"], key))
        name = label(model["encoding"], model["variant"], model["train_len"], train_lengths=model["train_lengths"])
        raise PosbenchError(
            f"compare: {name} seed {model['seed']} was measured alike in two runs, {first} and {second}; "
            "pairing needs one per seed: report them apart"
        )


def paired_seeds(model: pd.DataFrame, reference: pd.DataFrame) -> tuple[list[SeedPair], int]:
    """The seeds both have scored on the same tokens (the same articles, each with the same number of
    targets), and how many seeds of either are not paired."""
    pairs, unpaired = [], 0
    for seed in sorted(set(model["seed"]) | set(reference["seed"])):
        ours, theirs = (df[df["seed"] == seed].sort_values("article") for df in (model, reference))
        scored = [df[["article", "tokens"]].to_numpy() for df in (ours, theirs)]
        if ours.empty or scored[0].shape != scored[1].shape or (scored[0] != scored[1]).any():
            unpaired += 1
            continue
        tokens = ours["tokens"].to_numpy(dtype=float)
        pairs.append(SeedPair(tokens, ours["nll_sum"].to_numpy(), theirs["nll_sum"].to_numpy()))
    return pairs, unpaired


def paired_delta(pairs: list[SeedPair]) -> dict:
    """Mean NLLs, their difference (delta), exp(delta) and the bootstrap CI of delta; {} without pairs.

    The CI needs two articles in every seed (it is left empty otherwise).
    """
    if not pairs:
        return {}
    nll = np.mean([p.nll_sum.sum() / p.tokens.sum() for p in pairs])
    reference_nll = np.mean([p.reference_nll_sum.sum() / p.tokens.sum() for p in pairs])
    delta, articles = nll - reference_nll, min(len(p.tokens) for p in pairs)
    low, high = (math.nan, math.nan)
    if articles >= 2:
        tail = 100 * (1 - CONFIDENCE) / 2
        low, high = np.percentile(bootstrap_deltas(pairs, REPLICATES, BOOTSTRAP_SEED), [tail, 100 - tail])
    excludes_zero = None if math.isnan(low) else bool(low > 0 or high < 0)
    return dict(
        articles=articles,
        nll=nll,
        reference_nll=reference_nll,
        delta_nll=delta,
        ppl_ratio=math.exp(delta),
        ci_low=low,
        ci_high=high,
        ci_excludes_zero=excludes_zero,
    )


def bootstrap_deltas(pairs: list[SeedPair], replicates: int, seed: int) -> np.ndarray:
    """(replicates,): the mean over seeds of delta on a resample of each seed's articles, the same for both."""
    rng = np.random.default_rng(seed)
    total = np.zeros(replicates)
    for pair in pairs:
        n = len(pair.tokens)
        draw = rng.integers(n, size=(replicates, n))  # (replicates, n): article indices, with replacement
        difference = pair.nll_sum - pair.reference_nll_sum  # (n,)
        total += difference[draw].sum(1) / pair.tokens[draw].sum(1)
    return total / len(pairs)


def compare_markdown(compare: pd.DataFrame, reference: str, uncompared: int) -> list[str]:
    """summary.md's section: a table per split and eval mode; ``uncompared``: runs without per_article.csv."""
    intro = (
        f"## Paired comparison against {reference}\n\n"
        f"Δ NLL: mean NLL per token minus that of {reference} as trained (same train_len, seed and "
        f"tokens), mean over the seeds both have (`seeds`; `unpaired`: seeds only one has or scored on other "
        f"tokens). {CONFIDENCE:.0%} CI: {REPLICATES:,} bootstrap resamples of the split's articles within each "
        "seed, the same articles for both (empty with one article). ppl ratio: exp(Δ NLL), below 1 where the "
        f"model beats {reference}."
    )
    if uncompared:
        intro += f" {uncompared} run(s) without per_article.csv are not compared ({HOW_TO_WRITE})."
    if compare.empty:
        return [f"{intro}\n\nNo other model was measured alike."]
    sections = [intro]
    for split in splits(compare):
        for mode in eval_modes(compare[compare["split"] == split]):
            rows = compare[(compare["split"] == split) & (compare["eval_mode"] == mode)]
            sections.append(f"### {split}, {mode_title(rows, mode)}\n\n{compare_table(rows)}")
    return sections


def compare_table(compare: pd.DataFrame) -> str:
    """The Markdown rows of ``compare``, by model and eval length."""
    df = compare.sort_values(
        ["encoding", "variant", "train_len", "precision", "train_lengths", "config", "eval_len"],
        key=lambda column: column.map(natural_key) if column.name == "variant" else column,
    )
    model = ["encoding", "variant", "train_len", *(["precision"] if (df["precision"] != "").any() else [])]
    model += [] if at_train_len_alone(df).all() else ["train_lengths"]
    model += ["config"] if (df["config"] != "").any() else []
    header = [*model, "eval_len", "seeds", "unpaired", "Δ NLL", f"{CONFIDENCE:.0%} CI", "ppl ratio", "CI excludes 0"]
    rows = []
    for row in df.itertuples():
        measured = row.seeds > 0
        ci = f"[{row.ci_low:+.4f}, {row.ci_high:+.4f}]" if measured and not math.isnan(row.ci_low) else ""
        excludes = "" if ci == "" else ("yes" if row.ci_excludes_zero else "no")
        numbers = [f"{row.delta_nll:+.4f}", ci, f"{row.ppl_ratio:.3f}", excludes] if measured else ["", "", "", ""]
        rows.append([*(getattr(row, c) for c in model), row.eval_len, row.seeds, row.unpaired_seeds, *numbers])
    right = {"train_len", "eval_len", "seeds", "unpaired", "Δ NLL", "ppl ratio"}
    return markdown_table(header, rows, right=right)
