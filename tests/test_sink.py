"""Attention sinks (``eval.sink=S``): beside a window or blocks, the sequence's first S keys stay visible
to every query. (The backends' agreement: tests/test_attention_variants.py.)"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from posbench import attention as attention_mod
from posbench.commands.eval import evaluate_checkpoint, register
from posbench.config import EvalConfig
from posbench.evaluate import variant_of
from posbench.masks import causal_mask, reaching, reaching_block_mask
from posbench.positional import build_encoding
from posbench.variant import AttentionVariant

SEQ = 40


def visible(i: int, j: int, window: int, sink: int) -> bool:
    """The definition: key j is not after query i, and among its last ``window`` keys or its first ``sink``."""
    return j <= i and (i - j < window or j < sink)


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
    torch.testing.assert_close(causal_mask(alibi, pos, pos, AttentionVariant(window=2, sink=2)), expected)
    assert expected[0, 0, 6, 1].isfinite() and not expected[0, 0, 6, 2].isfinite()  # a sink, then a cut key


def test_sinks_beside_blocks_see_the_first_keys_too():
    nope = build_encoding({"name": "none"}, n_heads=1, head_dim=4, d_model=4, train_len=SEQ)
    pos = torch.arange(12)
    seen = causal_mask(nope, pos, pos, AttentionVariant(blockwise=3, sink=1))[0, 0] == 0
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
        assert torch.equal(reaching(AttentionVariant(window=window, sink=sink))(0, 0, q, k), truth)
        needed = torch.zeros(rows, rows, dtype=torch.bool)
        for a in range(rows):
            for b in range(rows):
                needed[a, b] = truth[a * block : (a + 1) * block, b * block : (b + 1) * block].any()
        listed = (
            reaching_block_mask(n, AttentionVariant(window=window, sink=sink), torch.device("cpu"))
            .to_dense()[0, 0]
            .bool()
        )
        assert torch.equal(listed, needed), (window, sink)


def test_variant_names_the_sinks():
    eval_cfg = OmegaConf.structured(EvalConfig(window=256, sink=4))
    assert variant_of({"name": "none"}, eval_cfg) == "window256+sink4"
    assert variant_of({"name": "none"}, OmegaConf.merge(eval_cfg, {"sink": 0})) == "window256"


@pytest.mark.parametrize(
    "overrides", [["eval.sink=4"], ["eval.window=8", "eval.sink=-1"]], ids=["without a window", "negative"]
)
def test_sinks_without_a_window_or_below_zero_are_one_line(overrides):
    from posbench.commands.launch import validate_overrides
    from posbench.errors import PosbenchError

    with pytest.raises(PosbenchError, match="eval.sink keeps the first keys visible beside eval.window"):
        validate_overrides("train", ["experiment=smoke", *overrides], False)


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
