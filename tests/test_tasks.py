"""Synthetic tasks: sequences laid out as asked, drawn the same by seed, scored against models whose answer is known."""

from __future__ import annotations

import math
import re
import signal

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from posbench import train as train_module
from posbench.attention import Attention
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.config import check_config
from posbench.errors import PosbenchError
from posbench.model import LanguageModel
from posbench.positional import build_encoding
from posbench.tasks import build_task
from posbench.tasks.measure import eval_distances, measure_task, measured, training_sequences
from posbench.train import train

#: Seconds: the tiny model, 10 steps, two lengths, few trials.
QUICK = [
    "model=tiny",
    "train.steps=10",
    "train.eval_every=4",
    "train.checkpoint_every=3",
    "eval_lens=[64,128]",
    "task.trials=8",
    "precision=fp32",
]


def full(batch) -> torch.Tensor:
    """The whole token sequences (n, length + 1) of a Batch."""
    return torch.cat([batch.x, batch.y[:, -1:]], 1)


def draw(task, length, distance, n=16, seed=1):
    return task.sequences(np.random.default_rng(seed), length, np.full(n, distance))


@pytest.mark.parametrize("name", ["passkey", "mqar", "copy"])
def test_sequences_are_drawn_the_same_by_seed_and_step_and_differ_otherwise(name):
    task = build_task({"name": name})
    x, y = training_sequences(task, seed=3, step=7, length=64, n=8)
    again = training_sequences(task, seed=3, step=7, length=64, n=8)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, training_sequences(task, seed=3, step=8, length=64, n=8)[0])
    assert not torch.equal(x, training_sequences(task, seed=4, step=7, length=64, n=8)[0])
    scored = y != -100  # task.loss=answer: the answer's targets only, each the next input
    assert scored.sum(1).tolist() == [task.answer_in_query().count(True)] * 8
    assert torch.equal(y[:, :-1][scored[:, :-1]], x[:, 1:][scored[:, :-1]])


def passkey_layout(row: list[int], key_len: int) -> tuple[int, list[int]]:
    """(distance, key) read off a passkey sequence: the only two marks (id 0), each followed by the key."""
    marks = [i for i, t in enumerate(row) if t == 0]
    assert len(marks) == 2 and marks[1] == len(row) - 1 - key_len  # the query ends the sequence
    key = row[marks[0] + 1 : marks[0] + 1 + key_len]
    assert row[marks[1] + 1 :] == key
    return marks[1] - (marks[0] + 1 + key_len), key


@pytest.mark.parametrize("length, distance", [(64, 0), (64, 54), (200, 17), (200, 190)])
def test_passkey_sits_at_the_distance_asked_and_the_answer_is_the_key(length, distance):
    task = build_task({"name": "passkey", "key_len": 4})
    batch = draw(task, length, distance)
    for row in full(batch).tolist():
        found, key = passkey_layout(row, 4)
        assert found == distance and len(set(key)) == 4 and all(t >= 17 for t in key)  # symbols follow filler
        assert all(1 <= t <= 16 for i, t in enumerate(row) if t != 0 and t not in key)  # the rest is filler
    assert batch.answer.nonzero().flatten().tolist() == list(range(length - 4, length))  # targets of the key


@pytest.mark.parametrize("distance", [0, 9, 30])
def test_mqar_asks_for_keys_whose_values_sit_before_the_gap(distance):
    task = build_task({"name": "mqar", "pairs": 5, "queries": 3})
    length = 60
    batch = draw(task, length, distance)
    symbols = range(17, 17 + 32)
    for row in full(batch).tolist():
        query = row[-6:]
        source_end = len(row) - 6 - distance  # the pairs end `distance` filler tokens before the queries
        pairs = row[source_end - 10 : source_end]
        values = dict(zip(pairs[::2], pairs[1::2]))
        assert len(values) == 5 and set(values) <= set(symbols)
        assert set(values.values()) <= set(range(17 + 32, 17 + 64))  # values from a range of their own
        assert all(values[k] == v for k, v in zip(query[::2], query[1::2]))
        assert not any(t in symbols for t in row[: source_end - 10] + row[source_end:-6])  # filler between
    assert batch.answer.nonzero().flatten().tolist() == [length - 5, length - 3, length - 1]  # the asked values


def test_mqar_without_answers_in_input_shows_filler_where_a_value_would_follow_its_key():
    """Zoology's protocol: the targets are the values as before, the input after each query key is filler."""
    shown = build_task({"name": "mqar", "pairs": 5, "queries": 3})
    hidden = build_task({"name": "mqar", "pairs": 5, "queries": 3, "answers_in_input": False})
    length = 40
    plain, batch = draw(shown, length, 7), draw(hidden, length, 7)
    assert torch.equal(batch.y, plain.y) and torch.equal(batch.answer, plain.answer)
    inputs_after_keys = [length - 4, length - 2]  # the inputs after the first two keys (the last is past x)
    others = [i for i in range(length) if i not in inputs_after_keys]
    assert torch.equal(batch.x[:, others], plain.x[:, others])
    assert torch.equal(plain.x[:, inputs_after_keys], plain.y[:, [i - 1 for i in inputs_after_keys]])  # shown
    assert ((batch.x[:, inputs_after_keys] >= 1) & (batch.x[:, inputs_after_keys] <= 16)).all()  # filler ids
    assert torch.equal(draw(hidden, length, 7).x, batch.x)  # the same by the seed


def test_mqar_with_repeat_keys_may_ask_a_key_again_and_more_often_than_there_are_pairs():
    task = build_task({"name": "mqar", "pairs": 3, "queries": 8, "repeat_keys": True})
    batch = draw(task, 40, 5, n=64)
    asked_again = 0
    for row in full(batch).tolist():
        query, pairs = row[-16:], row[-16 - 5 - 6 : -16 - 5]
        values = dict(zip(pairs[::2], pairs[1::2]))
        assert len(values) == 3 and all(values[k] == v for k, v in zip(query[::2], query[1::2]))
        asked_again += len(set(query[::2])) < 8
    assert asked_again == 64  # 8 queries of 3 keys
    with pytest.raises(ValueError, match="task.queries=8"):
        build_task({"name": "mqar", "pairs": 3, "queries": 8})


@pytest.mark.parametrize("distance", [0, 21])
def test_copy_repeats_the_span_after_the_distance_and_scores_all_but_its_first_token(distance):
    task = build_task({"name": "copy", "span": 6})
    batch = draw(task, 50, distance)
    for row in full(batch).tolist():
        second = row[-6:]
        first = row[-12 - distance : -6 - distance]
        assert first == second and all(t >= 17 for t in first)
        assert all(t < 17 for t in row[-6 - distance : -6])
    assert batch.answer.nonzero().flatten().tolist() == list(range(45, 50))


def test_distances_are_those_the_length_holds_and_the_longest():
    task = build_task({"name": "passkey", "key_len": 4})  # 10 tokens besides filler: 64 inputs hold 0..55
    assert eval_distances(task, None, 64, 64) == [0, 16, 32, 55]
    assert eval_distances(task, None, 64, 256) == [0, 16, 32, 64, 128, 247]
    assert eval_distances(task, [0, 100, 300], 64, 256) == [0, 100]


class Retriever(nn.Module):
    """Whatever follows the last earlier occurrence of the current token (induction, done by hand), looked up
    in the last ``reach`` tokens: it solves every task, as far as it sees. No occurrence: uniform logits."""

    def __init__(self, vocab_size: int, reach: int | None = None):
        super().__init__()
        self.vocab_size, self.reach = vocab_size, reach
        self.encoding = build_encoding({"name": "none"}, n_heads=1, head_dim=1, d_model=1, train_len=64)
        self.attention = Attention("eager", self.encoding)

    def logits(self, idx: torch.Tensor, last: int) -> torch.Tensor:
        out = torch.zeros(len(idx), last, self.vocab_size)
        for b, row in enumerate(idx.tolist()):
            for i, t in enumerate(range(len(row) - last, len(row))):
                earliest = 0 if self.reach is None else max(0, t - self.reach)
                seen = [j for j in range(earliest, t) if row[j] == row[t]]
                if seen:
                    out[b, i, row[seen[-1] + 1]] = 10.0
        return out


@pytest.mark.parametrize("task_name", ["passkey", "mqar", "copy"])
def test_a_hand_built_retriever_scores_one_at_every_distance(compose_config, task_name):
    cfg = compose_config("train", [f"task={task_name}", "eval_lens=[64,256]", "task.trials=8"])
    task = build_task(cfg.task)
    model = Retriever(task.vocab_size)
    rows = measure_task(model, task, cfg, "cpu", model.logits)
    assert set(rows["eval_len"]) == {64, 256} and rows["distance"].max() == task.max_distance(256)
    assert (rows["accuracy"] == 1.0).all() and (rows["token_accuracy"] == 1.0).all() and (rows["status"] == "ok").all()


def test_a_retriever_that_sees_w_tokens_scores_chance_beyond_them(compose_config):
    cfg = compose_config("train", ["task=mqar", "eval_lens=[256]", "task.trials=8", "task.queries=1"])
    task = build_task(cfg.task)
    model = Retriever(task.vocab_size, reach=40)  # a query's key repeats a pair's, distance + 2 to 16 tokens back
    rows = measure_task(model, task, cfg, "cpu", model.logits)
    rows = rows[rows["eval_len"] == 256].set_index("distance")
    assert (rows.loc[[0, 16], "accuracy"] == 1.0).all()  # at most 16 + 16 < 40 back
    assert (rows.loc[[64, 128, 239], "accuracy"] == 0.0).all()
    assert np.allclose(rows.loc[[64, 128, 239], "nll"], math.log(task.vocab_size))  # uniform: chance


class AttentionRetriever(nn.Module):
    """One head of posbench's attention, weights set by hand, for passkey with a key of one symbol: every query
    looks for symbols (filler and marks score 0) and copies the one it finds. With ``eval.window`` W it finds the
    key only within W; beyond, it sees filler alone, whose values are zero: uniform logits, chance."""

    def __init__(self, task):
        super().__init__()
        self.vocab_size, self.first_symbol = task.vocab_size, task.offsets["symbol"]
        self.encoding = build_encoding({"name": "none"}, n_heads=1, head_dim=task.vocab_size, d_model=1, train_len=64)
        self.attention = Attention("sdpa", self.encoding)

    def logits(self, idx: torch.Tensor, last: int) -> torch.Tensor:
        symbol = F.one_hot(idx, self.vocab_size).float() * (idx >= self.first_symbol)[..., None]  # (B, T, V)
        v = symbol[:, None]  # (B, 1, T, V): a symbol's own one-hot, 0 for filler and marks
        k = v * 40 * math.sqrt(self.vocab_size)  # SDPA divides by sqrt(head_dim)
        q = torch.ones_like(v)
        plan = self.attention.plan(idx.shape[1], idx.device, False, 0.0)
        return 20 * self.attention(q, k, v, plan)[:, 0, -last:]  # (B, last, V)


def test_eval_window_keeps_retrieval_within_the_window_and_chance_beyond(compose_config):
    window = 50
    cfg = compose_config(
        "train", ["task=passkey", "task.key_len=1", "eval_lens=[256]", "task.trials=8", f"eval.window={window}"]
    )
    task = build_task(cfg.task)
    model = AttentionRetriever(task)
    rows = measure_task(model, task, cfg, "cpu", model.logits)
    assert set(rows["variant"]) == {"window50"}
    rows = rows[rows["eval_len"] == 256].set_index("distance")
    assert (rows.loc[[0, 16, 32], "accuracy"] == 1.0).all()  # the key is distance + 1 keys back: within 50
    assert (rows.loc[[64, 128, 253], "accuracy"] == 0.0).all()
    assert np.allclose(rows.loc[[64, 128, 253], "nll"], math.log(task.vocab_size), atol=1e-6)
    plain = measure_task(
        model,
        task,
        compose_config("train", ["task=passkey", "task.key_len=1", "eval_lens=[256]", "task.trials=8"]),
        "cpu",
        model.logits,
    )
    assert (plain["accuracy"] == 1.0).all()  # the same model without the window finds every key


def test_random_weights_score_chance(compose_config):
    cfg = compose_config("train", ["task=passkey", "model=tiny", "eval_lens=[64,128]", "precision=fp32"])
    task = build_task(cfg.task)
    torch.manual_seed(0)
    model = LanguageModel(cfg.model, cfg.encoding, task.vocab_size, cfg.train_len)
    rows = measure_task(model, task, cfg, "cpu")
    assert (rows["accuracy"] == 0.0).all()  # four symbols in a row: chance is 32^-4
    assert rows["token_accuracy"].max() < 4 / task.cfg.symbols  # chance: 1/32
    assert np.allclose(rows["nll"], math.log(task.vocab_size), atol=0.05)  # near-uniform logits


class Oracle(Retriever):
    """The Retriever as a model (``forward`` then ``head``, as ``measured`` calls one): right at every length."""

    precision = "fp32"

    def __init__(self, vocab_size: int):
        super().__init__(vocab_size)
        self.head = nn.Identity()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.logits(idx, idx.shape[1])


def test_the_model_as_trained_judges_whether_the_task_was_learned(compose_config):
    # a variant that breaks the model (random weights here) is measured as it is, and judged by the model as
    # trained (the oracle): its rows show the damage at train_len, not "not learned"
    cfg = compose_config("train", ["task=passkey", "model=tiny", "eval_lens=[64]", "task.trials=8", "precision=fp32"])
    task = build_task(cfg.task)
    torch.manual_seed(0)
    broken = LanguageModel(cfg.model, cfg.encoding, task.vocab_size, cfg.train_len)
    rows = measured(broken, task, cfg, "cpu", as_trained=Oracle(task.vocab_size))
    assert (rows["status"] == "ok").all() and (rows["valid_accuracy"] == 1.0).all() and (rows["accuracy"] == 0).all()
    alone = measured(broken, task, cfg, "cpu")
    assert (alone["status"] == "not_learned").all() and (alone["valid_accuracy"] == 0.0).all()
    judged_right = measured(Oracle(task.vocab_size), task, cfg, "cpu", as_trained=broken)
    assert (judged_right["status"] == "not_learned").all() and (judged_right["accuracy"] == 1.0).all()


def test_learned_positions_past_their_table_are_unsupported(compose_config):
    cfg = compose_config("train", ["task=passkey", "encoding=learned", "model=tiny", "eval_lens=[64,128]"])
    task = build_task(cfg.task)
    model = LanguageModel(cfg.model, cfg.encoding, task.vocab_size, cfg.train_len)
    rows = measure_task(model, task, cfg, "cpu")
    assert set(rows.loc[rows["eval_len"] == 64, "status"]) == {"ok"}
    assert set(rows.loc[rows["eval_len"] == 128, "status"]) == {"unsupported"}
    assert rows.loc[rows["eval_len"] == 128, "accuracy"].isna().all()


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["task.symbols=100", "task.key_len=40"], "needs at least 81 tokens"),
        (["task.key_len=0"], "task.key_len=0 must be in [1, task.symbols=32]"),
        (["task.distances=[16,-1]"], "must be non-negative"),
        (["task.loss=most"], "task.loss must be one of answer, all"),
        (["probes=[copy]"], "trains on no text"),
        (["train.copy_loss=repeat"], "task=passkey trains on no text, which train.copy_loss needs"),
        (["train.copy_vocab=64", "train.copy_fraction=0.5"], "task=passkey trains on no text, which train.copy_vocab"),
    ],
)
def test_bad_task_options_fail_at_start_up(compose_config, overrides, fragment):
    with pytest.raises(PosbenchError, match=re.escape(fragment)):
        check_config(compose_config("train", ["task=passkey", *overrides]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides", [["task=nonesuch"], ["task=passkey", "task.key_len=70"], ["task=mqar", "'task.distances=[-1]'"]]
)
def test_bad_task_options_give_one_line_and_exit_2(posbench, assert_one_line, tmp_path, overrides):
    done = posbench("train", *overrides, f"hydra.run.dir={tmp_path}")
    assert_one_line(done, "task")


@pytest.fixture
def task_config(compose_config):
    def _config(task: str = "passkey", *overrides: str):
        return compose_config("train", [f"task={task}", *QUICK, *overrides])

    return _config


@pytest.mark.slow
def test_an_interrupted_task_run_resumes_to_the_same_numbers(task_config, tmp_path, monkeypatch):
    reference = train(task_config("mqar"), tmp_path / "reference")
    draw_sequences, calls = train_module.training_sequences, []

    def draw_and_signal(*args):
        calls.append(1)
        if len(calls) == 5:
            signal.raise_signal(signal.SIGTERM)
        return draw_sequences(*args)

    monkeypatch.setattr(train_module, "training_sequences", draw_and_signal)
    with pytest.raises(PosbenchError, match="stopped by SIGTERM at step 5 of 10"):
        train(task_config("mqar"), tmp_path / "run")
    monkeypatch.undo()
    resumed = train(task_config("mqar"), tmp_path / "run")
    assert resumed["best_valid_loss"] == reference["best_valid_loss"]
    tables = [pd.read_csv(tmp_path / d / "task_results.csv").drop(columns="run_id") for d in ("reference", "run")]
    pd.testing.assert_frame_equal(*tables, check_exact=True)
    logs = [pd.read_csv(tmp_path / d / "train_log.csv").drop(columns="tokens_per_s") for d in ("reference", "run")]
    pd.testing.assert_frame_equal(*logs, check_exact=True)
    monkeypatch.setattr(train_module, "training_sequences", lambda *args: pytest.fail("a finished run trains again"))
    assert train(task_config("mqar"), tmp_path / "run")["best_valid_loss"] == reference["best_valid_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["passkey", "mqar", "copy"])
def test_train_on_a_task_writes_task_results(posbench, tmp_path, task):
    done = posbench("train", f"task={task}", "encoding=alibi", *QUICK, "threads=1", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "task_results.csv")
    assert set(rows["eval_len"]) == {64, 128} and set(rows["task"]) == {task}
    assert set(rows["status"]) == {"not_learned"}  # ten steps of the tiny model learn nothing
    assert rows["reason"].str.contains("not learned").all() and set(rows["best_step"]) <= {4, 8, 10}
    assert rows["learned_step"].isna().all() and set(rows["stopped_step"]) == {10}
    assert not (tmp_path / "results.csv").exists() and "valid_accuracy" in pd.read_csv(tmp_path / "train_log.csv")


@pytest.mark.slow
def test_eval_measures_a_saved_task_run_again_in_a_variant(task_config, compose_config, tmp_path):
    train(task_config("passkey"), tmp_path)
    trained = pd.read_csv(tmp_path / "task_results.csv")
    register()
    command = compose_config("eval", [f"checkpoint={tmp_path}", "eval.window=16"])
    again = evaluate_checkpoint(command, ["checkpoint", "eval.window"], tmp_path)
    rows = pd.read_csv(tmp_path / "task_results.csv")
    assert set(again["variant"]) == {"window16"} and set(rows["variant"].fillna("")) == {"", "window16"}
    assert len(rows) == 2 * len(trained) and not (tmp_path / "results.csv").exists()
    assert (again["valid_accuracy"] == trained["valid_accuracy"].iloc[0]).all()  # judged as trained
