"""Attention backends: the same causal attention with every encoding's bias, forward and backward."""

from __future__ import annotations

import logging

import pytest
import torch

from posbench import attention as attention_mod
from posbench.attention import Attention
from posbench.backends import eager_attention
from posbench.masks import causal_mask
from posbench.model import LanguageModel
from posbench.positional import ENCODINGS, PositionEncoding, build_encoding

VOCAB, SEQ = 50, 40  # 40: not a multiple of flex's 128-token blocks
CUDA = torch.cuda.is_available()


@pytest.fixture
def build(tiny_lm):
    """build(name, backend, device="cpu", **model) -> a tiny LM, in training mode, with noisy encoding parameters."""

    def _build(name: str, backend: str, device: str = "cpu", **model) -> LanguageModel:
        return tiny_lm(name, vocab=VOCAB, train_len=SEQ, attention=backend, encoding_noise=0.5, **model).to(device)

    return _build


def encoding(name: str, n_heads: int = 8, head_dim: int = 4):
    return build_encoding({"name": name}, n_heads=n_heads, head_dim=head_dim, d_model=n_heads * head_dim, train_len=SEQ)


def nll_and_grads(lm: LanguageModel, x: torch.Tensor, y: torch.Tensor):
    nll = lm.token_nll(x, y)
    nll.mean().backward()
    return nll.detach(), {n: p.grad for n, p in lm.named_parameters() if p.grad is not None}


def batch(device: str = "cpu"):
    gen = torch.Generator().manual_seed(1)
    return (torch.randint(0, VOCAB, (2, SEQ), generator=gen).to(device) for _ in range(2))


def assert_same(nll_a, grads_a, nll_b, grads_b):
    torch.testing.assert_close(nll_a, nll_b, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4, msg=name)


def test_eager_matches_attention_written_out_by_hand():
    """ALiBi slopes for 2 heads are 1/16 and 1/256; softmax over keys j <= i of q·k/√d − m(i − j)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)  # (B, H, T, hd) each
    slopes = [1 / 16, 1 / 256]
    expected = torch.zeros_like(q)
    for h in range(2):
        for i in range(5):
            logits = torch.tensor([float(q[0, h, i] @ k[0, h, j]) / 2.0 - slopes[h] * (i - j) for j in range(i + 1)])
            expected[0, h, i] = (logits.softmax(0)[:, None] * v[0, h, : i + 1]).sum(0)
    alibi = encoding("alibi", n_heads=2)
    attn = Attention("eager", alibi)
    torch.testing.assert_close(attn(q, k, v, attn.plan(5, q.device, True, 0.0)), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        eager_attention(q, k, v, causal_mask(alibi, torch.arange(5), torch.arange(5))),
        expected,
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_sdpa_equals_eager_forward_and_backward(name, build):
    x, y = batch()
    assert_same(*nll_and_grads(build(name, "eager"), x, y), *nll_and_grads(build(name, "sdpa"), x, y))


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_query_blocks_equal_the_full_mask(name, backend, monkeypatch, build):
    """Past MASK_BUDGET the mask is built 7 queries at a time (sdpa without bias needs none)."""
    x, y = batch()
    lm = build(name, backend)
    full = nll_and_grads(lm, x, y)
    factor = lm.encoding.logit_memory_factor if lm.encoding.has_layer_terms else 1  # their blocks are smaller
    monkeypatch.setattr(attention_mod, "MASK_BUDGET", int(4 * lm.encoding.n_heads * SEQ * 7 * factor))
    lm = build(name, backend)
    blocks = backend == "eager" or lm.encoding.has_bias or lm.encoding.has_layer_terms
    assert lm.attention.plan(SEQ, x.device, True, 0.0).query_block == (7 if blocks else None)
    assert_same(*full, *nll_and_grads(lm, x, y))


@pytest.mark.parametrize("name", ["dape", "alibi"])
def test_query_blocks_go_last_first_so_each_needs_no_more_memory_than_the_last(name, monkeypatch, build):
    """Growing blocks (first first) each left the allocator's free space too small for the next: on CPU glibc's
    heap grew by every block (12 GB for DAPE at 16,384 tokens). Last first, each fits where the last was."""
    from posbench import backends

    keys_seen = []

    def recording_mask(encoding, q_idx, k_idx, *args):
        keys_seen.append(len(k_idx))
        return causal_mask(encoding, q_idx, k_idx, *args)

    lm = build(name, "eager")
    factor = lm.encoding.logit_memory_factor if lm.encoding.has_layer_terms else 1
    rows = 2 if lm.encoding.has_layer_terms else 1  # batch()'s 2 sequences: in inference, content blocks hold both
    monkeypatch.setattr(attention_mod, "MASK_BUDGET", int(4 * lm.encoding.n_heads * SEQ * 7 * factor * rows))
    monkeypatch.setattr(backends, "causal_mask", recording_mask)
    lm = build(name, "eager")
    x, _ = batch()
    with torch.no_grad():
        expected = lm(x)
    layer = keys_seen[: -(-SEQ // 7)]  # the first layer's blocks
    assert layer == sorted(layer, reverse=True) and layer[0] == SEQ and layer[-1] == 7
    monkeypatch.setattr(attention_mod, "MASK_BUDGET", 2**40)  # one block: the full mask
    torch.testing.assert_close(build(name, "eager")(x), expected)


#: Encodings whose layers compute terms of their own (``layer_terms``): eager only, whatever was asked, but
#: for those whose terms run on flex too (``terms_on_flex``: FoX).
CONTENT = [name for name, (_, cls) in ENCODINGS.items() if cls.layer_terms is not PositionEncoding.layer_terms]
EAGER_ONLY = [name for name in CONTENT if not ENCODINGS[name][1].terms_on_flex]


@pytest.mark.parametrize("name", EAGER_ONLY)
def test_content_terms_in_inference_hold_the_budget_for_the_whole_batch(name, monkeypatch, build):
    """Without gradients a block's logit-sized tensors are freed before the next, for every sequence of the
    batch at once: 3 sequences take blocks a third as tall (in training every block's stay for the backward
    pass, and the blocks are one sequence's). The numbers equal the full mask's."""
    x = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(2))
    lm = build(name, "eager").eval()
    with torch.no_grad():
        full = lm(x)
    factor = lm.encoding.logit_memory_factor
    monkeypatch.setattr(attention_mod, "MASK_BUDGET", int(4 * lm.encoding.n_heads * SEQ * 21 * factor))
    lm = build(name, "eager").eval()
    assert lm.attention.plan(SEQ, x.device, False, 0.0, batch=3).query_block == 7
    assert lm.attention.plan(SEQ, x.device, True, 0.0, batch=3).query_block == 21
    # in training, a bias per sequence (randomized positions) still counts every sequence
    per_sequence = torch.arange(SEQ).expand(3, SEQ)
    expected = 7 if lm.encoding.has_bias else 21
    assert lm.attention.plan(SEQ, x.device, True, 0.0, per_sequence, batch=3).query_block == expected
    planned, plan = [], lm.attention.plan

    def recording(*args, **kwargs):
        planned.append(plan(*args, **kwargs))
        return planned[-1]

    monkeypatch.setattr(lm.attention, "plan", recording)
    with torch.no_grad():
        torch.testing.assert_close(lm(x), full)
    assert [plan.query_block for plan in planned] == [7]


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in ENCODINGS if name not in CONTENT])
def test_flex_equals_eager(name, build):
    """Forward on CPU (FlexAttention has no CPU backward); forward and backward on CUDA."""
    device = "cuda" if CUDA else "cpu"
    x, y = batch(device)
    eager, flex = build(name, "eager", device), build(name, "flex", device)
    assert flex.attention.pick(SEQ, x.device, CUDA, 0.0) == "flex"
    if CUDA:
        assert_same(*nll_and_grads(eager, x, y), *nll_and_grads(flex, x, y))
    else:
        with torch.no_grad():
            torch.testing.assert_close(flex.token_nll(x, y), eager.token_nll(x, y), atol=1e-5, rtol=1e-5)
    assert not flex.attention.flex_broken


@pytest.mark.slow
def test_flex_stays_right_across_lengths(build):
    """Several lengths in one process, two of them filling their last 128-token block only partly
    (on CPU, torch 2.13 gave NaN there in some processes: scripts/flex_cpu_check.py)."""
    eager, flex = build("alibi", "eager"), build("alibi", "flex")
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for length in (128, 200, SEQ):
            x, y = torch.randint(0, VOCAB, (2, 2, length), generator=gen)
            torch.testing.assert_close(flex.token_nll(x, y), eager.token_nll(x, y), atol=1e-5, rtol=1e-5)


def test_flex_sees_whole_blocks_only(monkeypatch):
    """The CPU fault is intermittent, so check the padding itself: the kernel gets whole 128-token
    blocks of zeros beyond the sequence, and the caller gets back exactly the sequence."""
    seen = []

    def kernel(q, k, v, score_mod, block_mask):
        seen.append((q.shape[2], k[:, :, 40:].abs().sum().item(), block_mask.seq_lengths))
        return v

    monkeypatch.setattr(attention_mod, "flex_kernel", lambda: kernel)
    flex = alibi_attention("flex")
    q, k, v = torch.randn(3, 1, 8, 40, 4).unbind(0)
    with torch.no_grad():
        out = flex(q, k, v, flex.plan(40, torch.device("cpu"), False, 0.0))
    assert seen == [(attention_mod.FLEX_BLOCK, 0.0, (attention_mod.FLEX_BLOCK, attention_mod.FLEX_BLOCK))]
    torch.testing.assert_close(out, v)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_compiled_blocks_equal_eager(name, build):
    """model.compile=true trains with the same numbers as eager (rope: q, k with new strides)."""
    x, y = batch()
    reference = build(name, "eager")
    compiled = build(name, "sdpa", compile=True)
    assert list(compiled.state_dict()) == list(reference.state_dict())  # no `_orig_mod.` prefix
    assert_same(*nll_and_grads(reference, x, y), *nll_and_grads(compiled, x, y))


def alibi_attention(backend: str) -> Attention:
    return Attention(backend, encoding("alibi"))


def test_auto_trains_with_eager_on_cpu_only_in_bf16_without_dropout_up_to_its_length():
    cpu, longest = torch.device("cpu"), attention_mod.EAGER_AUTO_MAX_TRAIN_LEN
    auto = Attention("auto", encoding("rope", head_dim=32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert auto.pick(longest, cpu, needs_grad=True, dropout_p=0.0) == "eager"
        assert auto.pick(longest + 1, cpu, needs_grad=True, dropout_p=0.0) == "sdpa"
        assert auto.pick(longest, cpu, needs_grad=False, dropout_p=0.0) == "sdpa"  # evaluation
        assert auto.pick(longest, cpu, needs_grad=True, dropout_p=0.1) == "sdpa"
    with torch.autocast("cpu", dtype=torch.float16):
        assert auto.pick(longest, cpu, needs_grad=True, dropout_p=0.0) == "sdpa"
    assert auto.pick(longest, cpu, needs_grad=True, dropout_p=0.0) == "sdpa"  # fp32


def test_auto_picks_flex_only_to_evaluate_long_sequences_with_bias():
    cpu = torch.device("cpu")
    auto = alibi_attention("auto")
    long = attention_mod.FLEX_AUTO_MIN_LEN
    assert auto.pick(long, cpu, needs_grad=False, dropout_p=0.0) == "flex"
    assert auto.pick(long, cpu, needs_grad=True, dropout_p=0.0) == "sdpa"  # training: no flex backward on CPU
    assert auto.pick(long - 1, cpu, needs_grad=False, dropout_p=0.0) == "sdpa"
    rotary = Attention("auto", encoding("rope", head_dim=32))
    assert rotary.pick(long, cpu, needs_grad=False, dropout_p=0.0) == "sdpa"  # causal SDPA needs no mask
    auto.flex_broken = True
    plan = auto.plan(16384, cpu, needs_grad=False, dropout_p=0.0)
    assert plan.backend == "sdpa" and plan.mask is None and plan.query_block is not None


def test_auto_runs_fox_on_flex_only_to_evaluate_long_sequences_and_never_on_sdpa():
    """FoX's terms fit flex's score_mod (``terms_on_flex``); sdpa cannot compute them, nor flex stick-breaking's."""
    cpu, long = torch.device("cpu"), attention_mod.FLEX_AUTO_MIN_LEN
    auto = Attention("auto", encoding("fox"))
    assert auto.pick(long, cpu, needs_grad=False, dropout_p=0.0) == "flex"
    assert auto.pick(long - 1, cpu, needs_grad=False, dropout_p=0.0) == "eager"
    assert auto.pick(long, cpu, needs_grad=True, dropout_p=0.0) == "eager"  # training: no flex backward on CPU
    assert Attention("auto", encoding("stickbreaking")).pick(long, cpu, needs_grad=False, dropout_p=0.0) == "eager"
    auto.flex_broken = True
    assert auto.plan(long, cpu, needs_grad=False, dropout_p=0.0).backend == "eager"


def test_fox_asked_for_flex_trains_on_eager_with_one_warning(caplog):
    flex = Attention("flex", encoding("fox"))
    with caplog.at_level(logging.WARNING):
        picks = [flex.pick(64, torch.device("cpu"), needs_grad=True, dropout_p=0.0) for _ in range(3)]
    assert picks == ["eager"] * 3
    assert len([r for r in caplog.records if "no backward on CPU; using eager" in r.message]) == 1


def test_long_sequences_never_build_the_full_mask():
    """16,384 tokens, 8 heads: a dense fp32 mask would be 8 GiB; blocks of queries stay within budget."""
    cpu = torch.device("cpu")
    for backend in ("eager", "sdpa"):
        plan = alibi_attention(backend).plan(16384, cpu, needs_grad=False, dropout_p=0.0)
        assert plan.mask is None and plan.query_block is not None
        assert 8 * plan.query_block * 16384 * 4 <= attention_mod.MASK_BUDGET


def test_flex_that_cannot_run_falls_back_to_sdpa_with_one_warning(monkeypatch, caplog):
    def broken_kernel():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(attention_mod, "flex_kernel", broken_kernel)
    flex, sdpa = alibi_attention("flex"), alibi_attention("sdpa")
    q, k, v = torch.randn(3, 1, 8, 16, 4).unbind(0)
    cpu = torch.device("cpu")
    with caplog.at_level(logging.WARNING), torch.no_grad():
        for _ in range(3):
            out = flex(q, k, v, flex.plan(16, cpu, False, 0.0))
    torch.testing.assert_close(out, sdpa(q, k, v, sdpa.plan(16, cpu, False, 0.0)))
    assert len([r for r in caplog.records if "FlexAttention failed" in r.message]) == 1
    assert flex.pick(16, cpu, needs_grad=False, dropout_p=0.0) == "sdpa"


def test_fox_on_flex_that_cannot_run_falls_back_to_eager(monkeypatch, build):
    def broken_kernel():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(attention_mod, "flex_kernel", broken_kernel)
    x, y = batch()
    flex, eager = build("fox", "flex").eval(), build("fox", "eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(flex.token_nll(x, y), eager.token_nll(x, y), atol=1e-6, rtol=1e-6)
    assert flex.attention.flex_broken


def test_flex_with_gradients_on_cpu_uses_sdpa_and_warns_once(caplog):
    flex = alibi_attention("flex")
    with caplog.at_level(logging.WARNING):
        picks = [flex.pick(64, torch.device("cpu"), needs_grad=True, dropout_p=0.0) for _ in range(3)]
    assert picks == ["sdpa"] * 3
    assert len([r for r in caplog.records if "no backward on CPU" in r.message]) == 1


def test_unknown_backend_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="model.attention must be one of auto, sdpa, flex, eager, got 'fash'"):
        alibi_attention("fash")


@pytest.mark.parametrize("attn_dropout, expected", [(None, 0.3), (0.0, 0.0), (1.0, 1.0)])
def test_attention_dropout_defaults_to_model_dropout_in_training_only(attn_dropout, expected, build):
    lm = build("alibi", "sdpa", dropout=0.3, attn_dropout=attn_dropout)
    seen = []
    lm.attention.plan = lambda *args, plan=lm.attention.plan: seen.append(args[3]) or plan(*args)
    x, _ = batch()
    lm.train()(x)
    lm.eval()(x)
    assert seen == [expected, 0.0]


def test_attention_dropout_of_one_drops_every_weight():
    sdpa = alibi_attention("sdpa")
    q, k, v = torch.randn(3, 1, 8, 16, 4).unbind(0)
    plan = sdpa.plan(16, torch.device("cpu"), False, 1.0)
    assert plan.dropout_p == 1.0 and torch.count_nonzero(sdpa(q, k, v, plan)) == 0


@pytest.mark.parametrize("name, backend", [*((name, "sdpa") for name in CONTENT), *((n, "flex") for n in EAGER_ONLY)])
def test_layer_terms_run_on_eager_with_one_warning(name, backend, build, caplog):
    """sdpa cannot call a layer's terms, nor flex those without a score_mod: the pass runs on eager instead,
    and says so once."""
    x, y = batch()
    lm = build(name, backend)
    with caplog.at_level(logging.WARNING, logger="posbench.attention"):
        for _ in range(2):
            assert lm.attention.pick(SEQ, x.device, True, 0.0) == "eager"
    assert len([r for r in caplog.records if "using eager" in r.getMessage()]) == 1
    assert_same(*nll_and_grads(build(name, "eager"), x, y), *nll_and_grads(lm, x, y))


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_which_backends_compute_layer_terms_and_what_flex_falls_back_to(name):
    """eager computes every encoding; sdpa none with layer terms; flex only FoX's (a score_mod): a request that
    cannot serve the terms runs eager, and bench skips it rather than time eager under its name."""
    from posbench.attention import computes_terms

    content = name in CONTENT
    for backend, expected in [("eager", True), ("sdpa", not content), ("flex", not content or name == "fox")]:
        assert (
            computes_terms(build_encoding({"name": name}, n_heads=4, head_dim=8, d_model=32, train_len=SEQ), backend)
            == expected
        )
    if content:
        attention = Attention("flex", build_encoding({"name": name}, n_heads=4, head_dim=8, d_model=32, train_len=SEQ))
        assert attention.pick(8192, torch.device("cpu"), False, 0.0) == ("flex" if name == "fox" else "eager")
