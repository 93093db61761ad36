"""Evaluation-time attention variants that cut keys (blocks, a window with sinks, blocks with sinks) compute
the same thing in every backend: sdpa and eager on every encoding, queries block by block past
MASK_BUDGET, and flex. (The window alone: tests/test_window.py; each variant's mask against its
definition: tests/test_blockwise.py, tests/test_sink.py.)"""

from __future__ import annotations

import pytest
import torch

from posbench import attention as attention_mod
from posbench.positional import ENCODINGS
from posbench.variant import AttentionVariant

VOCAB, SEQ = 50, 40
VARIANTS = {
    "blocks": dict(blockwise=6),
    "window and sinks": dict(window=6, sink=3),
    "blocks and sinks": dict(blockwise=6, sink=3),
}
#: At SEQ tokens, each kind once hiding no key and once hiding one: blocks of half the sequence hold every
#: key a query has; a window of SEQ - 3 hides keys 0..2 from the last queries, which 3 sinks give back.
NO_CUT = {"blocks": dict(blockwise=SEQ // 2), "window and sinks": dict(window=SEQ - 3, sink=3)}
ONE_CUT = {"blocks": dict(blockwise=SEQ // 2 - 1), "window and sinks": dict(window=SEQ - 4, sink=3)}
#: 300 tokens in flex's 128-token blocks: blocks across two of them, sinks reaching into the second.
LONG = {"blocks": dict(blockwise=100), "window and sinks": dict(window=40, sink=130)}


@pytest.fixture
def build(tiny_lm):
    def _build(name: str, backend: str):
        return tiny_lm(name, vocab=VOCAB, train_len=SEQ, attention=backend, encoding_noise=0.5).eval()

    return _build


def tokens(length: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = torch.randint(0, VOCAB, (2, 2, length), generator=torch.Generator().manual_seed(1))
    return x, y


@torch.no_grad()
def nll(lm, x, y, **variant) -> torch.Tensor:
    with lm.attention.evaluated_as(AttentionVariant(**variant)):
        return lm.token_nll(x, y)


@pytest.mark.parametrize("kind", list(VARIANTS))
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_sdpa_equals_eager(name, kind, build):
    x, y = tokens()
    eager = nll(build(name, "eager"), x, y, **VARIANTS[kind])
    torch.testing.assert_close(nll(build(name, "sdpa"), x, y, **VARIANTS[kind]), eager, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(eager, nll(build(name, "eager"), x, y))  # the variant did something


@pytest.mark.parametrize("kind", list(NO_CUT))
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_a_variant_that_hides_no_key_changes_nothing(backend, kind, build):
    """A variant whose cut hides no key (NO_CUT) is plain causal attention; one key hidden more, and the
    numbers change."""
    x, y = tokens()
    lm = build("alibi", backend)
    assert torch.equal(nll(lm, x, y, **NO_CUT[kind]), nll(lm, x, y))
    assert not torch.equal(nll(lm, x, y, **ONE_CUT[kind]), nll(lm, x, y))


@pytest.mark.parametrize("kind", list(VARIANTS))
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_query_blocks_keep_the_variant(backend, kind, build, monkeypatch):
    """Past MASK_BUDGET the queries go 7 at a time, each group with the sinks and the keys its window or
    blocks reach."""
    x, y = tokens()
    full = nll(build("rope", backend), x, y, **VARIANTS[kind])
    monkeypatch.setattr(attention_mod, "MASK_BUDGET", 4 * 4 * SEQ * 7)  # 4 heads
    lm = build("rope", backend)
    with lm.attention.evaluated_as(AttentionVariant(**VARIANTS[kind])):
        assert lm.attention.plan(SEQ, x.device, False, 0.0).query_block == 7
    torch.testing.assert_close(nll(lm, x, y, **VARIANTS[kind]), full, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(LONG))
def test_flex_equals_eager(kind, build):
    x, y = tokens(300)
    eager, flex = build("alibi", "eager"), build("alibi", "flex")
    torch.testing.assert_close(nll(flex, x, y, **LONG[kind]), nll(eager, x, y, **LONG[kind]), atol=1e-5, rtol=1e-5)
    assert not flex.attention.flex_broken
