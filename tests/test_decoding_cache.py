"""Incremental decoding with the key/value cache equals the full forward pass, for every encoding and variant."""

import pytest
import torch

from posbench.masks import causal_mask
from posbench.positional import ENCODINGS, PositionEncoding
from posbench.positional.rope import RopeScalingConfig
from posbench.runtime import autocast
from posbench.variant import AttentionVariant

LENGTH, PROMPT, VOCAB = 40, 5, 50
#: Past the training length of 16 (learned: its table of 64), so the variants act.
SETTINGS = {
    "learned": dict(train_len=64),
    "rope/linear": dict(encoding="rope", options=dict(scaling=RopeScalingConfig(type="linear", factor=2.0))),
    "rope/ntk": dict(encoding="rope", options=dict(scaling=RopeScalingConfig(type="ntk", factor=4.0))),
    "rope/dynamic": dict(encoding="rope", options=dict(scaling=RopeScalingConfig(type="dynamic", factor=2.0))),
    "rope/yarn": dict(encoding="rope", options=dict(scaling=RopeScalingConfig(type="yarn", factor=4.0))),
    "rope/logn": dict(encoding="rope", logn_scaling=True),
    "alibi/eager": dict(encoding="alibi", attention="eager"),
    "xpos/eager": dict(encoding="xpos", attention="eager"),
}
CASES = sorted({*ENCODINGS, *SETTINGS})
#: Evaluation-time attention variants (``Attention.evaluated_as``) and their keyword arguments.
VARIANTS = {
    "window": dict(window=12),
    "window+sink": dict(window=12, sink=2),
    "blockwise": dict(blockwise=8),
    "temperature": dict(temperature=1.3),
}


@pytest.fixture
def model(tiny_lm):
    def _model(case: str):
        setting = dict(SETTINGS.get(case, {}))
        encoding = setting.pop("encoding", case)
        options = setting.pop("options", None)
        return tiny_lm(encoding, vocab=VOCAB, options=options, encoding_noise=0.1, **setting).eval()

    return _model


def logits_of(model, idx, cache=None):
    with autocast(idx.device, model.precision):
        return model.head(model(idx, cache=cache)).float()  # (B, T, V)


@torch.no_grad()
def cached_logits(model, idx, prompt: int = PROMPT):
    """Logits at every position from position ``prompt - 1`` on: the prompt in one pass, then a token a step."""
    cache = model.new_cache(idx.shape[1])
    steps = [logits_of(model, idx[:, :prompt], cache)[:, -1]]
    steps += [logits_of(model, idx[:, t : t + 1], cache)[:, -1] for t in range(prompt, idx.shape[1])]
    return torch.stack(steps, dim=1)  # (B, T - prompt + 1, V)


@torch.no_grad()
def prefix_logits(model, idx, prompt: int = PROMPT):
    """The same logits without a cache: position t from a full pass over the first t + 1 tokens."""
    return torch.stack([logits_of(model, idx[:, : t + 1])[:, -1] for t in range(prompt - 1, idx.shape[1])], dim=1)


def tokens(batch: int = 2):
    return torch.randint(0, VOCAB, (batch, LENGTH), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", CASES)
def test_cached_decoding_equals_the_full_pass(model, case):
    lm, idx = model(case), tokens()
    cached = cached_logits(lm, idx)
    torch.testing.assert_close(cached, prefix_logits(lm, idx), rtol=1e-5, atol=1e-5)
    if not lm.encoding.rotates_per_pass:  # the logits of one pass over the whole sequence, too
        torch.testing.assert_close(cached, logits_of(lm, idx)[:, PROMPT - 1 :], rtol=1e-5, atol=1e-5)


#: Encodings whose layers compute terms of their own: their cache holds those terms' state; the window with sinks
#: (keys cut, a few kept) is their one variant here, as every variant reaches them through the same mask.
CONTENT = [name for name, (_, cls) in ENCODINGS.items() if cls.layer_terms is not PositionEncoding.layer_terms]
STATIC_CASES = ["alibi", "rope", "t5", "fire", "xpos", "none", "kerple_log", "rope/dynamic"]
VARIANT_CASES = [
    *((case, variant) for variant in VARIANTS for case in STATIC_CASES),
    *((case, "window+sink") for case in CONTENT),
]


@pytest.mark.parametrize("case, variant", VARIANT_CASES)
def test_cached_decoding_equals_the_full_pass_in_every_attention_variant(model, case, variant):
    lm, idx = model(case), tokens()
    with lm.attention.evaluated_as(AttentionVariant(**VARIANTS[variant])):
        torch.testing.assert_close(cached_logits(lm, idx), prefix_logits(lm, idx), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["alibi", "rope", "xpos"])
def test_cached_decoding_in_bf16_equals_the_full_pass_to_bf16_precision(model, case):
    lm, idx = model(case), tokens()
    lm.precision = "bf16"
    cached, full = cached_logits(lm, idx), prefix_logits(lm, idx)
    torch.testing.assert_close(cached, full, rtol=0.05, atol=0.05)


def test_the_cache_changes_nothing_when_the_whole_sequence_is_one_pass(model):
    lm, idx = model("alibi"), tokens()
    with torch.no_grad():
        torch.testing.assert_close(logits_of(lm, idx, lm.new_cache(LENGTH)), logits_of(lm, idx), rtol=0, atol=0)


@pytest.mark.parametrize(
    "name", [n for n, (_, module) in ENCODINGS.items() if module.bias_at is not ENCODINGS["none"][1].bias_at]
)
def test_the_bias_of_new_queries_against_cached_keys_is_the_full_masks(tiny_lm, name):
    """``bias_at`` for queries t.. against keys 0..t: the rows of the full (T, T) mask (to the last bit of fp32:
    kerple_power's power may round differently)."""
    encoding = tiny_lm(name, encoding_noise=0.1).encoding
    keys = torch.arange(LENGTH)
    full = causal_mask(encoding, keys, keys)  # (1, H, T, T)
    for past in (0, 1, 17, LENGTH - 1):
        rows = causal_mask(encoding, keys[past:], keys)  # (1, H, T - past, T)
        torch.testing.assert_close(rows, full[:, :, past:], rtol=1e-6, atol=0)


def test_a_full_cache_says_so(model):
    lm = model("alibi")
    cache = lm.new_cache(4)
    with torch.no_grad(), pytest.raises(Exception, match="holds 4 tokens"):
        lm(tokens()[:, :5], cache=cache)
