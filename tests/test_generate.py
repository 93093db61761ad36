"""``posbench generate``: samples and their measures in the run folder for every encoding, sampling rules,
degeneration measures, merging, and bad options as one line."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from posbench.commands.generate import generate_checkpoint
from posbench.commands.generate import register as register_generate
from posbench.errors import PosbenchError
from posbench.generate import check_generate, degeneration_onset, pick, repeated_ngrams, window_rows
from posbench.positional import ENCODINGS
from posbench.runfolder import GENERATION, SAMPLES

SMALL = ["generate.prompts=3", "generate.prompt_len=8", "generate.max_len=72", "generate.window=16"]


@pytest.fixture
def generate(compose_config):
    """generate(run, overrides) as `posbench generate checkpoint=run SMALL overrides...` would; returns the
    samples (list of dicts) and generation.csv of the folder written to."""
    register_generate()

    def _generate(run, overrides=(), out=None):
        command = compose_config("generate", [f"checkpoint={run}", *SMALL, *overrides])
        keys = [o.split("=")[0] for o in overrides if not o.startswith("generate.")]
        generate_checkpoint(command, keys, out or run)
        folder = out or run
        samples = [json.loads(line) for line in (folder / SAMPLES).read_text().splitlines()]
        return samples, pd.read_csv(folder / GENERATION, keep_default_na=False, na_values=[""])

    return _generate


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_every_encoding_generates_to_max_len_but_learned_stops_at_its_table(tmp_path, saved_run, generate, encoding):
    run = saved_run(tmp_path / "run", encoding=encoding)
    samples, table = generate(run)
    assert [s["prompt_id"] for s in samples] == [0, 1, 2]
    learned = encoding == "learned"  # a table of train_len = 32 positions: 33 tokens, the last predicted at 31
    for s in samples:
        assert s["encoding"] == encoding and s["prompt_len"] == 8
        assert s["length"] == (33 if learned else 72) == 8 + len(s["generated"].split())
        assert (s["status"], bool(s["reason"])) == (("unsupported", True) if learned else ("ok", False))
    assert samples[1]["prompt_start"] > samples[0]["prompt_start"] == 0
    assert table.groupby("prompt_id")["tokens"].sum().tolist() == [25 if learned else 64] * 3
    assert set(table["position"]) == ({8, 24} if learned else {8, 24, 40, 56})
    assert table["nll"].between(0, 20).all() and table["distinct_2"].between(0, 1).all()


def test_the_prompt_is_the_test_split_and_a_seed_gives_the_same_samples(tmp_path, saved_run, generate, mini_data):
    from posbench.data import DataConfig, load_corpus

    run = saved_run(tmp_path / "run", encoding="alibi")
    first, _ = generate(run, ["generate.top_k=20"])
    again, _ = generate(run, ["generate.top_k=20"], out=tmp_path / "again")
    assert [s["generated"] for s in first] == [s["generated"] for s in again]
    other, _ = generate(run, ["generate.top_k=20", "generate.seed=1"], out=tmp_path / "other")
    assert [s["generated"] for s in first] != [s["generated"] for s in other]
    corpus = load_corpus(DataConfig(path=str(mini_data)))
    start = first[1]["prompt_start"]
    assert first[1]["prompt"].split() == [corpus.vocab[t] for t in corpus.splits["test"][start : start + 8]]


def test_given_text_is_the_prompt_and_greedy_decoding_repeats_itself_exactly(tmp_path, saved_run, generate):
    run = saved_run(tmp_path / "run", encoding="rope")
    text = "the game was released in Japan"
    samples, table = generate(run, [f"generate.text='{text}'", "generate.temperature=0"])
    (sample,) = samples
    assert sample["source"] == "text" and sample["prompt"] == text and sample["prompt_len"] == 6
    again, _ = generate(run, [f"generate.text='{text}'", "generate.temperature=0"], out=tmp_path / "again")
    assert again[0]["generated"] == sample["generated"]


def test_runs_merge_by_identity_and_variants_are_named(tmp_path, saved_run, generate):
    run = saved_run(tmp_path / "run", encoding="rope")
    generate(run)
    generate(run, ["generate.seed=3"])
    samples, table = generate(run)  # the first again: replaces its rows
    assert len(samples) == 6 and len(table) == 6 * 4
    samples, table = generate(run, ["eval.window=16", "rope.scaling.type=yarn", "rope.scaling.factor=2"])
    assert {s["variant"] for s in samples} == {"", "yarn×2+window16"}
    assert set(table["variant"].fillna("")) == {"", "yarn×2+window16"} and len(table) == 9 * 4


def test_pick_follows_temperature_top_k_and_top_p():
    logits = torch.tensor([[0.0, 3.0, 2.9, 1.0, -1.0]]).repeat(2000, 1)
    gen = torch.Generator().manual_seed(0)
    assert set(pick(logits, 0.0, 0, 1.0, gen).tolist()) == {1}
    assert set(pick(logits, 1.0, 1, 1.0, gen).tolist()) == {1}
    assert set(pick(logits, 1.0, 2, 1.0, gen).tolist()) == {1, 2}
    assert set(pick(logits, 1.0, 0, 0.01, gen).tolist()) == {1}  # the nucleus of the most likely token alone
    assert set(pick(logits, 1.0, 0, 0.6, gen).tolist()) == {1, 2}  # 0.45 + 0.41 reaches 0.6
    assert set(pick(logits, 1.0, 0, 1.0, gen).tolist()) == {0, 1, 2, 3, 4}
    hot = pick(logits, 100.0, 0, 1.0, gen).bincount(minlength=5)
    assert hot.min() > 300  # near uniform


def test_repetition_distinct_2_and_the_onset_of_a_loop():
    prompt = list(range(100, 120))  # 20 distinct tokens
    fresh = list(range(200, 240))  # 40 more
    loop = [1, 2, 3, 4, 5] * 20  # from position 60 on
    tokens = prompt + fresh + loop
    repeated = repeated_ngrams(tokens)
    assert np.isnan(repeated[:3]).all() and repeated[3:68].sum() == 0 and repeated[68:].all()
    # rolling share over 16 positions reaches 0.5 at 68 + 7 = 75 and stays
    assert degeneration_onset(repeated, 20, 16, 0.5) == 75
    assert degeneration_onset(repeated, 20, 16, 1.0) == 83
    assert degeneration_onset(repeated_ngrams(prompt + fresh), 20, 16, 0.5) is None
    assert degeneration_onset(repeated_ngrams([1, 2, 3] * 30), 40, 16, 0.5) == 40  # a looping prompt: not before it
    nll = np.arange(len(tokens) - 20, dtype=float)
    rows = window_rows(tokens, nll, 20, 40)
    assert [r["position"] for r in rows] == [20, 60, 100, 140] and [r["tokens"] for r in rows] == [40, 40, 40, 20]
    assert rows[0]["repetition"] == 0 and rows[2]["repetition"] == 1 and rows[1]["repetition"] == 32 / 40
    assert rows[0]["distinct_2"] == 1 and rows[2]["distinct_2"] == 5 / 40
    assert rows[0]["nll"] == pytest.approx(19.5)


def options(**given):
    base = dict(
        prompts=8,
        prompt_len=None,
        text=None,
        max_len=None,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        seed=0,
        batch_size=8,
        window=64,
        repetition_threshold=0.5,
    )
    return OmegaConf.create({**base, **given})


@pytest.mark.parametrize(
    "given, message",
    [
        (dict(max_len=10, prompt_len=16), "generate.max_len=10 is shorter than the prompt (16 tokens)"),
        (dict(max_len=2, text="three words here"), "shorter than the prompt (3 tokens)"),
        (dict(top_p=0.0), "generate.top_p must be in (0, 1]"),
        (dict(top_p=1.5), "generate.top_p must be in (0, 1]"),
        (dict(top_k=-1), "generate.top_k must be an integer >= 0"),
        (dict(temperature=-0.5), "generate.temperature must be a number >= 0"),
        (dict(temperature=math.inf), "generate.temperature must be a number >= 0"),
        (dict(prompts=0), "generate.prompts must be a positive integer"),
        (dict(text="  "), "generate.text holds no words"),
        (dict(window=0), "generate.window must be a positive integer"),
    ],
)
def test_bad_options_are_refused(given, message):
    with pytest.raises(PosbenchError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        check_generate(options(**given))


def test_lengths_that_wait_for_the_run_are_checked_once_it_is_loaded():
    check_generate(options(prompt_len=600))  # max_len: 16 x train_len, unknown yet
    with pytest.raises(PosbenchError, match="generate.max_len=512 is shorter than the prompt"):
        check_generate(options(prompt_len=600), train_len=32)


def test_bad_options_and_a_missing_checkpoint_are_one_line_at_start_up(tmp_path, saved_run, posbench, assert_one_line):
    run = saved_run(tmp_path / "run")
    done = posbench("generate", f"checkpoint={run}", "generate.max_len=4", "generate.prompt_len=8")
    assert_one_line(done, "generate.max_len=4 is shorter than the prompt (8 tokens)")
    assert_one_line(posbench("generate", f"checkpoint={run}", "generate.top_p=2"), "generate.top_p must be in (0, 1]")
    assert_one_line(posbench("generate", f"checkpoint={tmp_path / 'nowhere'}"), "does not exist")
    assert not (run / SAMPLES).exists()
