"""Blockwise causal attention (``eval.blockwise=W``, the xPos paper's inference): each query attends to
the keys of its own block of W positions and of the previous block. (The backends' agreement:
tests/test_attention_variants.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from posbench import attention as attention_mod
from posbench.config import EvalConfig
from posbench.evaluate import variant_of
from posbench.masks import causal_mask, reaching, reaching_block_mask
from posbench.positional import build_encoding
from posbench.variant import AttentionVariant

SEQ = 40


def visible(i: int, j: int, w: int) -> bool:
    """The definition: key j is in query i's block (i // w) or the block before, and not after i."""
    return j <= i and i // w - 1 <= j // w <= i // w


def test_the_mask_is_the_loop_definition():
    """ALiBi, 2 heads (slopes 1/16, 1/256), blocks of 3 over 8 positions: the bias where visible, else -inf."""
    alibi = build_encoding({"name": "alibi"}, n_heads=2, head_dim=4, d_model=8, train_len=SEQ)
    pos = torch.arange(8)
    expected = torch.full((1, 2, 8, 8), -math.inf)
    for h, slope in enumerate([1 / 16, 1 / 256]):
        for i in range(8):
            for j in range(8):
                if visible(i, j, 3):
                    expected[0, h, i, j] = -slope * (i - j)
    torch.testing.assert_close(causal_mask(alibi, pos, pos, AttentionVariant(blockwise=3)), expected)
    assert not expected[0, 0, 6, 2].isfinite() and expected[0, 0, 6, 3].isfinite()  # block 2 sees blocks 1, 2


def test_flex_block_mask_and_mask_mod_follow_the_definition():
    """300 positions in flex's 128-token blocks, blockwise 50 and 200: the mask_mod is the definition on
    every pair, and the BlockMask lists exactly the key blocks holding a visible pair."""
    n, block = 300, attention_mod.FLEX_BLOCK
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    for w in (50, 200):
        truth = torch.tensor([[visible(i, j, w) for j in range(n)] for i in range(n)])
        assert torch.equal(reaching(AttentionVariant(blockwise=w))(0, 0, q, k), truth)
        rows = -(-n // block)
        needed = torch.zeros(rows, rows, dtype=torch.bool)
        for a in range(rows):
            for b in range(rows):
                needed[a, b] = truth[a * block : (a + 1) * block, b * block : (b + 1) * block].any()
        listed = reaching_block_mask(n, AttentionVariant(blockwise=w), torch.device("cpu")).to_dense()[0, 0].bool()
        assert torch.equal(listed, needed), w


def test_variant_names_the_block_size():
    rope = OmegaConf.create({"name": "rope", "scaling": {"type": "yarn", "factor": 4}})
    eval_cfg = OmegaConf.structured(EvalConfig(blockwise=128))
    assert variant_of({"name": "xpos"}, eval_cfg) == "blockwise128"
    assert variant_of(rope, eval_cfg) == "yarn×4+blockwise128"


def test_a_window_inside_blocks_sees_the_keys_both_allow():
    """eval.window and eval.blockwise together (the window probe of a blockwise evaluation): the intersection."""
    nope = build_encoding({"name": "none"}, n_heads=1, head_dim=4, d_model=4, train_len=SEQ)
    pos = torch.arange(12)
    both = causal_mask(nope, pos, pos, AttentionVariant(window=4, blockwise=3))[0, 0] == 0
    assert both.tolist() == [[visible(i, j, 3) and i - j < 4 for j in range(12)] for i in range(12)]


def test_blocks_of_no_keys_are_one_line():
    from posbench.commands.launch import validate_overrides
    from posbench.errors import PosbenchError

    with pytest.raises(PosbenchError, match="eval.blockwise must be a positive number of keys or null, got 0"):
        validate_overrides("train", ["experiment=smoke", "eval.blockwise=0"], False)
