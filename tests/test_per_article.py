"""per_article.csv: articles split at title lines, each target's NLL counted once for its own article."""

import random
import re

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from posbench.config import Config
from posbench.data import Corpus, DataConfig, build_corpus, load_corpus
from posbench.errors import PosbenchError
from posbench.evaluate import evaluate_lengths
from posbench.runfolder import PER_ARTICLE, RESULTS, ModelState, check_mergeable

STATE = ModelState("run", 1, True)

# token:        0      1-4              5-7      8-13                 14-17           18-23
TEXT = [" ", " = First = ", " a b ", " = = Section = = ", " = Second = ", " = Not = a title "]
# token:        24-25    26-29         30-31
TEXT += [" === ", "= Third =", " d"]
STARTS = [0, 14, 26]  # the blank line before the first title belongs to article 0


def test_articles_start_at_title_lines():
    corpus = build_corpus({"train": TEXT, "valid": TEXT, "test": TEXT})
    assert len(corpus.splits["test"]) == 32
    assert corpus.article_starts["test"].tolist() == STARTS
    assert corpus.article_ids("test", 32).tolist() == [0] * 14 + [1] * 12 + [2] * 6
    assert corpus.article_ids("test", 20).tolist() == [0] * 14 + [1] * 6  # a capped split: its first tokens


def test_a_split_without_titles_is_one_article():
    corpus = build_corpus({"train": ["a b"], "valid": ["a"], "test": [" = = Section = = ", "a b"]})
    assert corpus.article_ids("test", 9).tolist() == [0] * 9


def test_shipped_test_split_articles_by_an_independent_pattern(mini_data):
    lines = (mini_data / "test.txt").read_text(encoding="utf-8").splitlines()
    titles = [i for i, line in enumerate(lines) if re.fullmatch(r"\s*= [^=](.*[^=])? =\s*", line)]
    corpus = load_corpus(DataConfig(path=str(mini_data)))
    starts = corpus.article_starts["test"]
    assert len(starts) == len(titles) > 50
    first_token = sum(len(line.split()) + 1 for line in lines[: titles[1]])
    assert starts[1] == first_token
    vocab = corpus.vocab
    assert {vocab[corpus.splits["test"][s]] for s in starts[1:].tolist()} == {"="}


def corpus_with_articles(n_articles: int = 7) -> Corpus:
    """``n_articles`` articles of a title and 1 to 3 lines of random words, each split the same."""
    words, rng, lines = [f"w{i}" for i in range(12)], random.Random(0), []
    for article in range(n_articles):
        lines += ["", f" = Title {article} = ", ""]
        lines += [" ".join(rng.choices(words, k=rng.randint(3, 14))) for _ in range(1 + article % 3)]
    return build_corpus({"train": lines, "valid": lines, "test": lines})


def eval_config(**eval_keys):
    cfg = {"encoding": {"name": "alibi"}, "train_len": 16, "eval_lens": [16, 32], "eval": {"splits": ["test"]}}
    cfg["eval"].update(eval_keys)
    return OmegaConf.merge(OmegaConf.structured(Config), cfg)


def test_per_article_sums_are_the_results_nll(tmp_path, tiny_lm):
    corpus = corpus_with_articles()
    model = tiny_lm("alibi", vocab=corpus.vocab_size, train_len=16)
    results = pd.concat(
        [
            evaluate_lengths(model, corpus, eval_config(), "cpu", tmp_path, STATE),
            evaluate_lengths(model, corpus, eval_config(mode="sliding", stride=8), "cpu", tmp_path, STATE),
        ]
    )
    articles = pd.read_csv(tmp_path / PER_ARTICLE, keep_default_na=False)
    totals = articles.groupby(["eval_mode", "stride", "eval_len"])[["tokens", "nll_sum"]].sum()
    assert len(totals) == len(results) == 4
    for result in results.itertuples():
        total = totals.loc[(result.eval_mode, result.stride, result.eval_len)]
        assert total["tokens"] == result.tokens == len(corpus.splits["test"]) - 1
        assert total["nll_sum"] / total["tokens"] == pytest.approx(result.nll, rel=1e-12)
    assert set(articles["article"]) == set(range(7))


@torch.no_grad()
def test_each_target_counts_for_its_own_article(tmp_path, tiny_lm):
    """Against window-by-window scoring done here, targets grouped by the article of the target token."""
    corpus = corpus_with_articles()
    model = tiny_lm("alibi", vocab=corpus.vocab_size, train_len=16).eval()
    evaluate_lengths(model, corpus, eval_config(), "cpu", tmp_path, STATE)
    tokens, eval_len = corpus.splits["test"], 16
    expected = torch.zeros(7, dtype=torch.float64)
    for start in range(0, len(tokens) - 1, eval_len):
        x, y = tokens[start : start + eval_len], tokens[start + 1 : start + eval_len + 1]
        x = x[: len(y)]
        nll = model.token_nll(x[None], y[None])[0].double()
        for offset, value in enumerate(nll):
            target = start + offset + 1  # the token predicted
            expected[int((corpus.article_starts["test"] <= target).sum()) - 1] += value
    articles = pd.read_csv(tmp_path / PER_ARTICLE)
    measured = articles[articles["eval_len"] == eval_len].sort_values("article")["nll_sum"]
    assert measured.tolist() == pytest.approx(expected.tolist(), rel=1e-5)


def test_a_reevaluation_replaces_its_own_rows(tmp_path, tiny_lm):
    corpus = corpus_with_articles()
    model = tiny_lm("alibi", vocab=corpus.vocab_size, train_len=16)
    evaluate_lengths(model, corpus, eval_config(), "cpu", tmp_path, STATE)
    again = eval_config(max_tokens=int(corpus.article_starts["test"][3]) + 1)  # articles 0-3 now
    evaluate_lengths(model, corpus, OmegaConf.merge(again, {"eval_lens": [16]}), "cpu", tmp_path, STATE)
    articles = pd.read_csv(tmp_path / PER_ARTICLE)
    assert sorted(articles[articles["eval_len"] == 16]["article"]) == [0, 1, 2, 3]  # no stale article 4-6
    assert sorted(articles[articles["eval_len"] == 32]["article"]) == list(range(7))  # kept


def test_an_unmergeable_per_article_file_stops_before_measuring(tmp_path):
    (tmp_path / RESULTS).write_text("split,eval_len\n")
    (tmp_path / PER_ARTICLE).write_text("article,tokens\n0,3\n")
    with pytest.raises(PosbenchError, match="per_article.csv is not a results file posbench can add rows to"):
        check_mergeable(tmp_path)
