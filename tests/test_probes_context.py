"""The context-usage probe on models whose answer is known: a fake that reads only its last W tokens, a tiny LM."""

import logging
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from posbench.errors import PosbenchError
from posbench.positional import Dimensions, EncodingConfig, PositionEncoding
from posbench.probes.context import (
    COLUMNS,
    SUBSETS,
    ContextProbeConfig,
    choose_targets,
    context_usage,
    effective_context,
    gain_beyond,
    per_window_for,
    plan_windows,
    previous_occurrence,
    score_at_context,
    seen_contexts,
    target_subsets,
)

VOCAB = 50


class WindowFake(nn.Module):
    """NLL of each target: a fixed function of the target and the last ``window`` input tokens, nothing older."""

    def __init__(self, window: int):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.by_lag = nn.Parameter(torch.rand(VOCAB, window, generator=g, dtype=torch.float64), requires_grad=False)
        self.by_target = torch.rand(VOCAB, generator=g, dtype=torch.float64)
        self.window = window
        self.encoding = PositionEncoding(
            EncodingConfig(), Dimensions(n_heads=1, head_dim=1, d_model=1, train_len=1)
        )  # serves any length

    def token_nll(self, idx, targets):
        nll = self.by_target[targets].clone()
        for lag in range(min(self.window, idx.shape[1])):
            nll[:, lag:] += self.by_lag[idx[:, : idx.shape[1] - lag], lag]
        return nll


@pytest.fixture
def tiny_model(tiny_lm):
    return lambda name, train_len=16: tiny_lm(name, vocab=VOCAB, train_len=train_len).eval()


def stream(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def all_rows(df: pd.DataFrame) -> pd.Series:
    return df[df["subset"] == "all"].set_index("context")["nll"]


def test_curve_is_exactly_flat_beyond_the_receptive_field():
    cfg = ContextProbeConfig(targets=300, contexts=[2, 4, 8, 16, 32, 64], block=16)
    nll = all_rows(context_usage(WindowFake(window=8), stream(2000), 16, cfg, batch_tokens=512))
    assert nll[8] == nll[16] == nll[32] == nll[64]
    assert nll[2] != nll[8] and nll[4] != nll[8]  # shorter contexts than the window do change it


def test_curve_beyond_the_window_equals_plain_scoring_of_the_same_targets():
    tokens, fake, cfg = stream(2000), WindowFake(window=8), ContextProbeConfig(targets=300, contexts=[16, 64], block=16)
    df = context_usage(fake, tokens, 16, cfg, batch_tokens=512)
    plain = fake.token_nll(tokens[None, :-1], tokens[None, 1:])[0].numpy()  # one window: all the context there is
    targets = choose_targets(len(tokens), 64, cfg.targets, cfg.block, cfg.seed)
    expected = plain[targets - 1]  # column j predicts token j + 1
    row = df[(df["context"] == 64) & (df["subset"] == "all")].iloc[0]
    assert row["targets"] == len(expected) == 300
    assert row["nll"] == pytest.approx(expected.mean(), rel=1e-12)
    assert row["nll_se"] == pytest.approx(np.std(expected, ddof=1) / np.sqrt(len(expected)), rel=1e-12)
    assert row["ppl"] == pytest.approx(math.exp(expected.mean()), rel=1e-12)


def test_standard_error_per_subset_matches_numpy():
    tokens, fake, cfg = stream(1500), WindowFake(window=4), ContextProbeConfig(targets=400, contexts=[32], block=8)
    df = context_usage(fake, tokens, 8, cfg, batch_tokens=256).set_index("subset")
    targets = choose_targets(len(tokens), 32, cfg.targets, cfg.block, cfg.seed)
    seen = seen_contexts(targets, plan_windows(targets, 32, per_window_for(32)))
    subsets = target_subsets(tokens.numpy(), targets, seen, 8)
    nll = fake.token_nll(tokens[None, :-1], tokens[None, 1:])[0].numpy()[targets - 1]
    for subset in ["repeat_far", "repeat_near", "novel"]:
        values = nll[subsets == subset]
        assert df.loc[subset, "targets"] == len(values) > 1
        assert df.loc[subset, "nll_se"] == pytest.approx(np.std(values, ddof=1) / np.sqrt(len(values)), rel=1e-9)
    assert df.loc[["repeat_far", "repeat_near", "novel"], "targets"].sum() == df.loc["all", "targets"]


@pytest.mark.parametrize("context", [1, 3, 4, 16, 100, 256, 1000])
@pytest.mark.parametrize("block", [1, 7, 64])
def test_every_target_sees_between_k_and_one_and_a_quarter_k_tokens(context, block):
    targets = choose_targets(20_000, context, 500, block, seed=1)
    plan = plan_windows(targets, context, per_window_for(context))
    seen = seen_contexts(targets, plan)
    assert (seen >= context).all() and (seen <= 1.25 * context).all()
    assert [first for _, first, _ in plan] == [0] + [stop for _, _, stop in plan[:-1]]  # each target once
    assert plan[-1][2] == len(targets)


def test_choose_targets_is_seeded_and_eligible():
    a = choose_targets(5000, 1000, 300, 16, seed=0)
    assert len(a) == len(set(a)) == 300 and a.min() >= 1000 and a.max() < 5000 and (np.diff(a) > 0).all()
    assert (a == choose_targets(5000, 1000, 300, 16, seed=0)).all()
    assert not np.array_equal(a, choose_targets(5000, 1000, 300, 16, seed=1))
    assert len(choose_targets(1100, 1000, 300, 16, seed=0)) == 100  # at most what the stream has


def test_tiny_model_scores_each_target_with_the_context_it_is_planned(tiny_model):
    model, tokens, context = tiny_model("rope"), stream(400), 24
    targets = choose_targets(len(tokens), context, 40, 8, seed=0)
    plan = plan_windows(targets, context, per_window_for(context))
    nll = score_at_context(model, tokens, targets, plan, batch_tokens=64)
    with torch.no_grad():
        for target, seen, got in zip(targets, seen_contexts(targets, plan), nll):
            x, y = tokens[None, target - seen : target], tokens[None, target - seen + 1 : target + 1]
            assert got == pytest.approx(model.token_nll(x, y)[0, -1].item(), abs=1e-5)


def test_subsets_on_a_hand_made_stream():
    #         index: 0  1  2  3  4  5  6  7  8  9  10
    tokens = np.array([1, 2, 3, 9, 5, 6, 3, 3, 5, 8, 1])
    assert previous_occurrence(tokens).tolist() == [-1, -1, -1, -1, -1, -1, 2, 6, 4, -1, 0]
    targets, seen = np.array([6, 7, 8, 8, 9, 10, 10]), np.array([6, 1, 4, 3, 9, 10, 9])
    got = target_subsets(tokens, targets, seen, train_len=2)
    # 6: the 3 at 2 is 4 back, inside 6 but not the last 2; 7: the 3 at 6 is 1 back; 8: the 5 at 4 is 4 back,
    # inside 4, outside 3; 9: no 8 before; 10: the 1 at 0 is 10 back, inside 10 and outside 9.
    expected = ["repeat_far", "repeat_near", "repeat_far", "novel", "novel", "repeat_far", "novel"]
    assert got.tolist() == expected
    assert target_subsets(tokens, np.array([7]), np.array([1]), train_len=0).tolist() == ["repeat_far"]
    assert target_subsets(tokens, np.array([8]), np.array([3]), train_len=5).tolist() == ["novel"]  # not in sight


def test_previous_occurrence_matches_a_scan():
    tokens = stream(300).numpy()
    last, expected = {}, []
    for i, token in enumerate(tokens):
        expected.append(last.get(token, -1))
        last[token] = i
    assert previous_occurrence(tokens).tolist() == expected


def test_tiny_model_gives_every_column(tiny_model):
    cfg = ContextProbeConfig(targets=64, contexts=[8, 16, 32], block=8)
    df = context_usage(tiny_model("alibi"), stream(300), 16, cfg, batch_tokens=256, split="valid")
    assert list(df.columns) == COLUMNS
    assert df[["context", "subset"]].values.tolist() == [[k, s] for k in [8, 16, 32] for s in SUBSETS]
    assert (df["split"] == "valid").all() and (df["status"] == "ok").all()
    assert np.isfinite(df[df["subset"] == "all"]["nll"]).all()


def test_contexts_beyond_the_data_are_dropped_with_one_warning(caplog):
    cfg = ContextProbeConfig(targets=32, block=8)  # default contexts: 16 .. 256 at train_len 16
    with caplog.at_level(logging.WARNING, logger="posbench.probes"):
        df = context_usage(WindowFake(window=4), stream(300), 16, cfg, batch_tokens=256)
    assert sorted(set(df["context"])) == [16, 32, 64, 128]  # half of 300 tokens at most
    assert len(caplog.records) == 1 and "probe.contexts" in caplog.records[0].getMessage()
    with pytest.raises(PosbenchError, match="probe.contexts"):
        context_usage(WindowFake(window=4), stream(20), 16, cfg, batch_tokens=256)


def test_learned_positions_beyond_the_table_give_unsupported_rows(tiny_model):
    df = context_usage(tiny_model("learned"), stream(600), 16, ContextProbeConfig(targets=32, block=8), 256)
    status = df.groupby("context")["status"].agg(set)
    assert status[16] == {"ok"}  # served with fewer targets per window than k // 4 would give
    assert all(status[k] == {"unsupported"} for k in [32, 64, 128, 256])
    assert df[df["status"] == "unsupported"]["reason"].str.contains("cannot serve").all()


def curve_frame(nll_by_context: dict[int, float]) -> pd.DataFrame:
    rows = [dict(context=k, subset="all", nll=v, status="ok") for k, v in nll_by_context.items()]
    rows += [dict(context=k, subset="novel", nll=0.0, status="ok") for k in nll_by_context]  # must be ignored
    rows.append(dict(context=4096, subset="all", nll=math.nan, status="unsupported"))
    return pd.DataFrame(rows)


def test_derived_numbers_from_a_known_curve():
    df = curve_frame({16: 5.30, 32: 5.25, 64: 5.242, 128: 5.235, 256: 5.236, 512: 5.234})
    assert effective_context(df) == 64  # the first within 0.01 of the minimum 5.234
    assert gain_beyond(df, 128) == pytest.approx(5.235 - 5.234)
    assert gain_beyond(df, 16) == pytest.approx(5.30 - 5.234)
    assert math.isnan(gain_beyond(df, 100))


@pytest.mark.parametrize(
    "kwargs, key",
    [(dict(targets=0), "probe.targets"), (dict(contexts=[0, 16]), "probe.contexts"), (dict(block=0), "probe.block")],
)
def test_bad_options_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ContextProbeConfig(**kwargs)


def test_a_context_the_encoding_serves_with_hardly_more_is_not_probed_past_train_len(tiny_lm):
    """Learned with a table of 64 rows, trained at 16: k = 32 is served with 8 targets per 39-token window;
    k = 64 only with one target per 64-token window, 64 forward tokens per target (> train_len 16), which at
    scale (k = 4,096: 4,096 windows of 4,096 tokens) takes hours: unsupported, saying why, not probed."""
    model = tiny_lm("learned", vocab=VOCAB, train_len=16, options={"max_positions": 64}).eval()
    df = context_usage(model, stream(600), 16, ContextProbeConfig(targets=32, block=8, contexts=[16, 32, 64]), 256)
    status = df.groupby("context")["status"].agg(set)
    assert status[16] == {"ok"} and status[32] == {"ok"} and status[64] == {"unsupported"}
    assert df[df["context"] == 64]["reason"].str.contains("too costly to probe").all()
