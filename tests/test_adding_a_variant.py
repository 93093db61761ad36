"""Adding an evaluation-time variant touches one dataclass field, its mask rule and its test: a toy variant,
defined here and nowhere else, runs on every backend and in the query blocks, and is labelled."""

from dataclasses import dataclass

import pytest
import torch

from posbench import attention as attention_mod
from posbench.model import LanguageModel, ModelConfig
from posbench.variant import AttentionVariant

SEQ = 24


@dataclass(frozen=True)
class OddKeysHidden(AttentionVariant):
    """The toy: every query sees only the keys an even distance back (itself, 2, 4, ...)."""

    even_only: bool = False

    def hides(self, q_idx, k_idx):
        return super().hides(q_idx, k_idx) | (self.even_only & ((q_idx - k_idx) % 2 == 1))

    def cuts_at(self, seq_len: int) -> bool:
        return self.even_only or super().cuts_at(seq_len)

    def label(self) -> str:
        return "+".join(part for part in (super().label(), "even" if self.even_only else "") if part)


def build(name: str, backend: str) -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.0, attention=backend)
    return LanguageModel(cfg, {"name": name}, vocab_size=50, train_len=SEQ).eval()


def reference_logits(lm: LanguageModel, x: torch.Tensor) -> torch.Tensor:
    """The toy's attention written out: each query's output is the softmax over its even-distance keys."""
    logits = []
    for t in range(SEQ):
        keep = torch.arange(t % 2, t + 1, 2)  # the keys an even distance back from t
        with torch.no_grad():
            logits.append(lm(x[:, keep])[:, -1])  # the last query sees its keys at their own positions
    return torch.stack(logits, dim=1)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["alibi", "none"])
def test_a_toy_variant_runs_on_every_backend_as_its_rule_says(name, backend, monkeypatch):
    x = torch.randint(50, (2, SEQ), generator=torch.Generator().manual_seed(1))
    lm = build(name, backend)
    with torch.no_grad(), lm.attention.evaluated_as(OddKeysHidden(even_only=True)):
        logits = lm(x)
        monkeypatch.setattr(attention_mod, "MASK_BUDGET", 4 * 2 * SEQ * 5)  # queries in blocks of 5
        lm.attention._cache.clear()
        blocked = lm(x)
    torch.testing.assert_close(blocked, logits, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        plain = lm(x)
    assert not torch.allclose(logits, plain)  # the rule took effect
    if name == "none":  # without positions, a query and its even keys alone give the same output
        torch.testing.assert_close(logits, reference_logits(lm, x), rtol=1e-5, atol=1e-5)


def test_flex_takes_the_toy_rule_from_the_same_method():
    from posbench.masks import reaching

    q, k = torch.arange(6)[:, None], torch.arange(6)[None, :]
    seen = reaching(OddKeysHidden(even_only=True))(0, 0, q, k)
    assert torch.equal(seen, (q >= k) & ((q - k) % 2 == 0))


def test_a_toy_variant_is_labelled_beside_the_others():
    assert OddKeysHidden(window=8, even_only=True).label() == "window8+even"
    assert OddKeysHidden().label() == ""
