"""Attention sinks (``eval.sink=S``): beside a window or blocks, the sequence's first S keys stay visible
to every query, in every backend."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from posbench import attention as attention_mod
from posbench.attention import causal_mask, reaching, reaching_block_mask
from posbench.config import EvalConfig
from posbench.evaluate import variant_of
from posbench.positional import ENCODINGS, build_encoding
from posbench.reevaluate import evaluate_checkpoint, register

VOCAB, SEQ, WINDOW, SINK = 50, 40, 6, 3


def visible(i: int, j: int, window: int, sink: int) -> bool:
    """The definition: key j is not after query i, and among its last ``window`` keys or its first ``sink``."""
    return j <= i and (i - j < window or j < sink)


@pytest.fixture
def build(tiny_lm):
    def _build(name: str, backend: str):
        return tiny_lm(name, vocab=VOCAB, train_len=SEQ, attention=backend, encoding_noise=0.5).eval()

    return _build


def tokens(length: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.randint(0, VOCAB, (2, 2, length), generator=torch.Generator().manual_seed(1))
    return x, y


@torch.no_grad()
def nll(lm, x, y, sink: int, window: int | None = WINDOW) -> torch.Tensor:
    with lm.attention.evaluated_as(window=window, sink=sink):
        return lm.token_nll(x, y)


def test_the_mask_is_the_loop_definition():
    """ALiBi, 2 heads (slopes 1/16, 1/256), window 2 and 2 sinks over 7 positions: the bias where visible."""
    alibi = build_encoding({"name": "alibi"}, n_heads=2, head_dim=4, d_model=8, train_len=SEQ)
    pos = torch.arange(7)
    expected = torch.full((1, 2, 7, 7), -math.inf)
    for h, slope in enumerate([1 / 16, 1 / 256]):
        for i in range(7):
            for j in range(7):
                if visible(i, j, 2, 2):
                    expected[0, h, i, j] = -slope * (i - j)
    torch.testing.assert_close(causal_mask(alibi, pos, pos, window=2, sink=2), expected)
    assert expected[0, 0, 6, 1].isfinite() and not expected[0, 0, 6, 2].isfinite()  # a sink, then a cut key


def test_sinks_beside_blocks_see_the_first_keys_too():
    nope = build_encoding({"name": "none"}, n_heads=1, head_dim=4, d_model=4, train_len=SEQ)
    pos = torch.arange(12)
    seen = causal_mask(nope, pos, pos, blockwise=3, sink=1)[0, 0] == 0
    assert seen.tolist() == [[j <= i and (i // 3 - 1 <= j // 3 or j < 1) for j in range(12)] for i in range(12)]


def test_flex_block_mask_and_mask_mod_follow_the_definition():
    """300 positions in flex's 128-token blocks; sinks inside the first block and reaching into the second:
    the mask_mod is the definition on every pair, and the BlockMask lists exactly the key blocks holding
    a visible pair."""
    n, block = 300, attention_mod.FLEX_BLOCK
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    rows = -(-n // block)
    for window, sink in ((40, 4), (40, 130), (200, 4)):
        truth = torch.tensor([[visible(i, j, window, sink) for j in range(n)] for i in range(n)])
        assert torch.equal(reaching(window, None, sink)(0, 0, q, k), truth)
        needed = torch.zeros(rows, rows, dtype=torch.bool)
        for a in range(rows):
            for b in range(rows):
                needed[a, b] = truth[a * block : (a + 1) * block, b * block : (b + 1) * block].any()
        listed = reaching_block_mask(n, window, None, torch.device("cpu"), sink=sink).to_dense()[0, 0].bool()
        assert torch.equal(listed, needed), (window, sink)


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_sdpa_equals_eager_with_sinks(name, build):
    x, y = tokens()
    eager = nll(build(name, "eager"), x, y, SINK)
    torch.testing.assert_close(nll(build(name, "sdpa"), x, y, SINK), eager, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(eager, nll(build(name, "eager"), x, y, 0))  # the sinks did something


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_sinks_without_a_cut_change_nothing(backend, build):
    """A window as long as the sequence hides no key, so there is nothing for a sink to keep."""
    x, y = tokens()
    lm = build("alibi", backend)
    assert torch.equal(nll(lm, x, y, SINK, window=SEQ), nll(lm, x, y, 0, window=None))


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_query_blocks_keep_the_sinks(backend, build, monkeypatch):
    """Past MASK_BUDGET the queries go 7 at a time, each group with the sinks and the keys its window reaches."""
    x, y = tokens()
    full = nll(build("rope", backend), x, y, SINK)
    monkeypatch.setattr(attention_mod, "MASK_BUDGET", 4 * 4 * SEQ * 7)  # 4 heads
    lm = build("rope", backend)
    with lm.attention.evaluated_as(window=WINDOW, sink=SINK):
        assert lm.attention.plan(SEQ, x.device, False, 0.0).query_block == 7
    torch.testing.assert_close(nll(lm, x, y, SINK), full, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_flex_equals_eager_with_sinks(build):
    x, y = tokens(300)
    eager, flex = build("alibi", "eager"), build("alibi", "flex")
    torch.testing.assert_close(nll(flex, x, y, 130, 40), nll(eager, x, y, 130, 40), atol=1e-5, rtol=1e-5)
    assert not flex.attention.flex_broken


def test_variant_names_the_sinks():
    eval_cfg = OmegaConf.structured(EvalConfig(window=256, sink=4))
    assert variant_of({"name": "none"}, eval_cfg) == "window256+sink4"
    assert variant_of({"name": "none"}, OmegaConf.merge(eval_cfg, {"sink": 0})) == "window256"


@pytest.mark.parametrize(
    "overrides", [["eval.sink=4"], ["eval.window=8", "eval.sink=-1"]], ids=["without a window", "negative"]
)
def test_sinks_without_a_window_or_below_zero_are_one_line(overrides):
    from posbench.cli import validate_overrides
    from posbench.config import check_config
    from posbench.errors import PosbenchError

    with pytest.raises(PosbenchError, match="eval.sink keeps the first keys visible beside eval.window"):
        validate_overrides("train", ["experiment=smoke", *overrides], False, check_config)


def test_posbench_eval_on_a_finished_run_writes_sink_rows(tmp_path, saved_run, compose_config):
    """A saved smoke run (train_len 32) evaluated at 64 with a window of 8, with and without 2 sinks."""
    run = saved_run(tmp_path / "run", encoding="none")
    register()
    for extra in (["eval.window=8"], ["eval.window=8", "eval.sink=2"]):
        overrides = [f"checkpoint={run}", "eval_lens=[64]", "eval.max_tokens=600", "eval.splits=[test]", *extra]
        evaluate_checkpoint(compose_config("eval", overrides), [o.split("=")[0] for o in overrides], run)
    nll = pd.read_csv(run / "results.csv", keep_default_na=False).set_index(["variant", "eval_len"])["nll"]
    assert {"window8", "window8+sink2"} <= set(nll.index.get_level_values("variant"))
    assert nll[("window8+sink2", 64)] != nll[("window8", 64)]
