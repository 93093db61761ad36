"""Every encoding in the registry: causality and length generality; the chunked loss."""

import pytest
import torch
from omegaconf import OmegaConf

from posbench.model import LanguageModel, ModelConfig
from posbench.positional import ENCODINGS

# sdpa: flex compiles a kernel per encoding (a minute each on CPU); test_attention checks flex equals sdpa.
TINY = ModelConfig(name="tiny", n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention="sdpa")
VOCAB = 50


def make_model(name: str, train_len: int = 16) -> LanguageModel:
    torch.manual_seed(0)
    config_cls, _ = ENCODINGS[name]
    model = LanguageModel(TINY, OmegaConf.structured(config_cls()), VOCAB, train_len)
    # Learned biases start near zero; perturb them so the tests see the encoding at work.
    with torch.no_grad():
        for p in model.encoding.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_causal(name):
    model = make_model(name)
    idx = torch.randint(0, VOCAB, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB  # change every token from position 10 on
    with torch.no_grad():
        before, after = model(idx), model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_runs_past_training_length_where_supported(name):
    model = make_model(name, train_len=256)
    idx = torch.randint(0, VOCAB, (1, 1024))
    reason = model.encoding.unsupported_reason(1024)
    if reason is not None:
        assert name == "learned" and model.encoding.unsupported_reason(256) is None
        return
    with torch.no_grad():
        nll = model.token_nll(idx, idx)
    assert nll.shape == (1, 1024) and torch.isfinite(nll).all()


def test_token_nll_matches_cross_entropy_whatever_the_chunk():
    model = make_model("rope")
    idx = torch.randint(0, VOCAB, (3, 16))
    with torch.no_grad():
        logits = model.head(model(idx))
        reference = -torch.log_softmax(logits, -1).gather(-1, idx[..., None])[..., 0]
        model.cfg.loss_chunk = 5  # chunks of 1 position for a batch of 3
        torch.testing.assert_close(model.token_nll(idx, idx), reference)


def test_weights_tied_by_default():
    model = make_model("none")
    assert model.head.weight is model.tok_emb.weight
