"""Every encoding in the registry: causality and length generality; the chunked loss."""

import pytest
import torch

from posbench.config import TrainConfig
from posbench.optim import make_optimizer
from posbench.positional import ENCODINGS

# sdpa: flex compiles a kernel per encoding (a minute each on CPU); test_attention checks flex equals sdpa.
VOCAB = 50


@pytest.fixture
def make_model(tiny_lm):
    """make_model(name, train_len=16) -> a tiny LM in eval mode, its encoding's parameters perturbed."""
    return lambda name, train_len=16: tiny_lm(name, vocab=VOCAB, train_len=train_len, encoding_noise=0.1).eval()


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_causal(name, make_model):
    model = make_model(name)
    idx = torch.randint(0, VOCAB, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB  # change every token from position 10 on
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_runs_past_training_length_where_supported(name, make_model):
    model = make_model(name, train_len=256)
    idx = torch.randint(0, VOCAB, (1, 1024))
    reason = model.encoding.unsupported_reason(1024)
    if reason is not None:
        assert name == "learned" and model.encoding.unsupported_reason(256) is None
        return
    with torch.no_grad():
        nll = model.token_nll(idx, idx)
    assert nll.shape == (1, 1024) and torch.isfinite(nll).all()


def test_token_nll_matches_cross_entropy_whatever_the_chunk(make_model):
    model = make_model("rope")
    idx = torch.randint(0, VOCAB, (3, 16))
    with torch.no_grad():
        logits = model.head(model(idx))
        reference = -torch.log_softmax(logits, -1).gather(-1, idx[..., None])[..., 0]
        model.cfg.loss_chunk = 5  # chunks of 1 position for a batch of 3
        torch.testing.assert_close(model.token_nll(idx, idx), reference)


def test_weights_tied_by_default(make_model):
    model = make_model("none")
    assert model.head.weight is model.tok_emb.weight


@pytest.mark.parametrize("name", ["learned", "fox", "cope"])
def test_weight_decay_spares_the_encodings_parameters_its_own_and_its_layers(name, make_model):
    """Matrices decay, but not an encoding's: learned's table (the encoding's own), FoX's gate and CoPE's
    position embeddings (each layer's content terms)."""
    model = make_model(name)
    decayed, spared = (group["params"] for group in make_optimizer(model, TrainConfig()).param_groups)
    names = {id(p): n for n, p in model.named_parameters()}
    encodings = [n for n in names.values() if n.startswith("encoding.") or ".attn.terms." in n]
    assert encodings and all(names[id(p)] not in encodings for p in decayed)
    assert {names[id(p)] for p in spared} >= set(encodings)
    assert "blocks.0.attn.qkv.weight" in {names[id(p)] for p in decayed}
