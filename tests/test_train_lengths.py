"""Mixed-length training (train.lengths): equal tokens per step, the curriculum's order, the random order
drawn from (seed, step) so that a resumed run trains exactly as an uninterrupted one, bad input in one line."""

from __future__ import annotations

import signal
from collections import Counter

import pandas as pd
import pytest

from posbench import train as train_module
from posbench.checkpoint import RESUME_CHECKPOINT, load_checkpoint
from posbench.config import check_config
from posbench.errors import PosbenchError
from posbench.report import report
from posbench.report.compare import check_one_run_per_seed, compare_encodings
from posbench.train import step_length, train

#: A smoke run (train_len 32, batch 4: 128 tokens a step) at 8, 16 and 32 tokens, evaluated briefly.
MIXED = [
    "experiment=smoke",
    "train.lengths=[8,16,32]",
    "train.steps=9",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "eval.splits=[valid]",
    "eval.max_tokens=1024",
    "train.val_tokens=512",
    "eval_lens=[32,64]",
]


@pytest.fixture
def mixed_config(compose_config, mini_data):
    def _config(*overrides: str):
        return compose_config("train", [*MIXED, f"data.path={mini_data}", *overrides])

    return _config


def lengths_config(compose_config, *overrides: str):
    return compose_config("train", ["experiment=smoke", *overrides])


def schedule(cfg) -> list[int]:
    return [step_length(cfg, step) for step in range(1, cfg.train.steps + 1)]


def test_curriculum_takes_equal_shares_of_the_steps_shortest_first(compose_config):
    cfg = lengths_config(compose_config, "train.lengths=[32,8,16]", "train.length_order=curriculum", "train.steps=9")
    assert schedule(cfg) == [8, 8, 8, 16, 16, 16, 32, 32, 32]  # the list's order does not matter
    uneven = schedule(lengths_config(compose_config, "train.lengths=[8,16,32]", "train.length_order=curriculum"))
    assert uneven == [8, 8, 16, 16, 32, 32]  # smoke's 6 steps
    longer = schedule(
        lengths_config(compose_config, "train.lengths=[8,32]", "train.length_order=curriculum", "train.steps=7")
    )
    assert longer == sorted(longer) and Counter(longer) == {8: 4, 32: 3}  # monotone, shares within one step


def test_random_order_is_a_function_of_seed_and_step(compose_config):
    cfg = lengths_config(compose_config, "train.lengths=[8,16,32]", "train.steps=300")
    lengths = schedule(cfg)
    assert set(Counter(lengths)) == {8, 16, 32} and min(Counter(lengths).values()) > 300 / 3 * 0.75  # about uniform
    assert lengths != sorted(lengths)  # drawn, not staged
    # asked in another order (as a run resumed at step 150 asks, holding no generator): the same lengths
    assert [step_length(cfg, step) for step in range(300, 150, -1)] == lengths[150:][::-1]
    assert schedule(lengths_config(compose_config, "train.lengths=[8,16,32]", "train.steps=300", "seed=1")) != lengths


def test_results_name_the_order_so_a_curriculum_is_not_taken_for_another_seed(compose_config):
    from posbench.lengths import train_lengths_label

    random_order = lengths_config(compose_config, "train.lengths=[32,8,16]")
    curriculum = lengths_config(compose_config, "train.lengths=[32,8,16]", "train.length_order=curriculum")
    assert train_lengths_label(random_order) == "8|16|32" and train_lengths_label(curriculum) == "8>16>32"
    assert train_lengths_label(lengths_config(compose_config)) == "32"


def test_without_lengths_every_step_is_at_train_len(compose_config):
    assert set(schedule(lengths_config(compose_config, "train.steps=20"))) == {32}


def test_tokens_per_step_stay_equal_and_results_name_every_length(mixed_config, tmp_path, monkeypatch):
    batches, sample = [], train_module.sample_batch

    def recorded(*args, **kwargs):
        x, y = sample(*args, **kwargs)
        batches.append(tuple(x.shape))
        return x, y

    monkeypatch.setattr(train_module, "sample_batch", recorded)
    train(mixed_config(), tmp_path)
    assert set(batches) == {(16, 8), (8, 16), (4, 32)}  # 128 tokens each: batch 4 x train_len 32
    log = pd.read_csv(tmp_path / "train_log.csv")  # a row per step (log_every=1)
    assert list(log["seq_len"]) == [length for _, length in batches]
    assert list(log["tokens"]) == [128 * step for step in range(1, 10)]
    results = pd.read_csv(tmp_path / "results.csv")
    assert set(results["train_len"]) == {32} and set(results["train_lengths"]) == {"8|16|32"}


@pytest.mark.slow
def test_random_lengths_resume_to_the_uninterrupted_numbers(mixed_config, tmp_path, monkeypatch):
    reference = train(mixed_config(), tmp_path / "reference")
    sample = train_module.sample_batch
    calls = {"n": 0}

    def sample_and_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            signal.raise_signal(signal.SIGTERM)
        return sample(*args, **kwargs)

    monkeypatch.setattr(train_module, "sample_batch", sample_and_signal)
    with pytest.raises(PosbenchError, match="stopped by SIGTERM at step 5 of 9"):
        train(mixed_config(), tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / RESUME_CHECKPOINT)["progress"]["step"] == 5
    monkeypatch.undo()
    resumed = train(mixed_config(), tmp_path / "run")
    assert resumed["best_valid_loss"] == reference["best_valid_loss"]
    logs = [pd.read_csv(tmp_path / d / "train_log.csv").drop(columns="tokens_per_s") for d in ("reference", "run")]
    pd.testing.assert_frame_equal(*logs, check_exact=True)  # the same lengths, batches and losses
    drop = ["run_dir", "run_id"]  # where and which run; the numbers are the same
    pd.testing.assert_frame_equal(
        resumed["results"].drop(columns=drop), reference["results"].drop(columns=drop), check_exact=True
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.lengths=[0,32]"], "train.lengths must hold positive integers, got [0, 32]"),
        (["train.lengths=[-8,32]"], "train.lengths must hold positive integers, got [-8, 32]"),
        (["train.lengths=[]"], "train.lengths=[] holds no length"),
        (["train.lengths=[16,16,32]"], "train.lengths must not repeat a length, got [16, 16, 32]"),
        (["train.lengths=[8,64]"], "train.lengths=[8, 64] needs train_len=64, its longest"),
        (["train.lengths=[8,16]"], "train.lengths=[8, 16] needs train_len=16, its longest"),
        (["train.lengths=[12,32]"], "train.lengths: [12] cannot keep tokens per step equal"),
        (["train.lengths=[5,7,32]", "train.batch_size=2"], "[5, 7] cannot keep tokens per step equal"),
        (["train.length_order=shortest"], "train.length_order must be one of random, curriculum, got 'shortest'"),
        (["train.length_order=curriculum"], "train.length_order=curriculum orders train.lengths, which is not given"),
    ],
)
def test_bad_lengths_are_refused_naming_the_key(compose_config, overrides, message):
    with pytest.raises(PosbenchError) as e:
        check_config(lengths_config(compose_config, *overrides))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_train_len_at_the_longest_length_is_accepted(compose_config):
    check_config(lengths_config(compose_config, "train.lengths=[16,64]", "train_len=64"))


@pytest.mark.slow
def test_cli_refuses_lengths_the_data_cannot_serve_in_one_line(posbench, assert_one_line, tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text("a few words for a tiny split\n" * 4)  # 4 x (7 words, <eos>)
    too_long = posbench(
        "train",
        "experiment=smoke",
        f"data.path={tmp_path}",
        "train.lengths=[8,32]",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert_one_line(too_long, "the train split has 32 tokens, too few for train.lengths=[8, 32]")
    assert not (tmp_path / "run" / "last.pt").exists()


def write_results(folder, ppl: float, train_lengths: str | None, seed: int = 0):
    """A rope run's results.csv at train_len 4, eval_len 4 and 8, and a per-position file without the column;
    ``train_lengths=None``: written before the column existed."""
    folder.mkdir(parents=True)
    line = dict(encoding="rope", variant="", train_len=4, split="test", eval_mode="nonoverlapping", seed=seed)
    rows = [
        dict(line, eval_len=n, stride=n, tokens=64, nll=0.0, ppl=ppl * n / 4, status="ok", run_dir=str(folder))
        for n in (4, 8)
    ]
    results = pd.DataFrame(rows)
    (results if train_lengths is None else results.assign(train_lengths=train_lengths)).to_csv(
        folder / "results.csv", index=False
    )
    positions = pd.DataFrame([dict(line, stride=8, eval_len=8, position=p, nll=1.0, count=8) for p in range(8)])
    positions.to_csv(folder / "per_position.csv", index=False)


def test_the_report_tells_runs_apart_by_their_training_lengths_and_names_them_only_when_mixed(tmp_path):
    write_results(tmp_path / "plain" / "a", 10.0, "4", seed=0)
    write_results(tmp_path / "plain" / "b", 12.0, None, seed=1)  # from before the column: trained at train_len
    plain = (report(tmp_path / "plain") / "summary.md").read_text()
    assert "| encoding | variant | train_len | 4 | 8 |" in plain and "| rope |  | 4 | 11.0 ± 1.4 |" in plain
    write_results(tmp_path / "mixed" / "a", 10.0, "4")
    write_results(tmp_path / "mixed" / "b", 12.0, "2|4")  # the same train_len, trained at 2 and 4
    out = report(tmp_path / "mixed")
    summary = pd.read_csv(out / "summary.csv", dtype={"train_lengths": str}).set_index(["train_lengths", "eval_len"])
    assert summary.loc[("4", 4), "ppl_mean"] == 10.0 and summary.loc[("2|4", 4), "ppl_mean"] == 12.0
    text = (out / "summary.md").read_text()
    assert "| encoding | variant | train_len | train_lengths | 4 | 8 |" in text
    assert "| rope |  | 4 | 2\\|4 | 12.0 |" in text and "| rope |  | 4 | 4 | 10.0 |" in text  # the | escaped


def test_paired_comparisons_tell_runs_apart_by_their_training_lengths():
    line = dict(variant="", train_len=16, precision="fp32", split="test", eval_mode="nonoverlapping", stride=64)
    rows = [
        dict(line, encoding=encoding, train_lengths=lengths, run_dir=folder, eval_len=64, seed=0, article=a)
        | dict(tokens=10, nll_sum=10 * (5.0 + shift))
        for folder, encoding, lengths, shift in (
            ("a", "alibi", "16", 0.0),
            ("r", "rope", "16", 0.1),
            ("rm", "rope", "8|16", 0.2),
            ("am", "alibi", "8|16", 0.3),
        )
        for a in range(4)
    ]
    articles = pd.DataFrame(rows)
    check_one_run_per_seed(articles)  # two rope runs of seed 0 are two models, not one measured twice
    deltas = compare_encodings(articles, "alibi").set_index(["encoding", "train_lengths"])["delta_nll"]
    # against alibi as trained at 16 alone; alibi trained at 8 and 16 is another model
    assert deltas.to_dict() == pytest.approx({("rope", "16"): 0.1, ("rope", "8|16"): 0.2, ("alibi", "8|16"): 0.3})
