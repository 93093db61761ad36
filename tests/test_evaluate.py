"""Evaluation protocols: windows, sliding vs non-overlapping, per-position loss, ppl_beyond, unigram reference."""

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from posbench.attention import Attention
from posbench.config import Config
from posbench.data import Corpus
from posbench.evaluate import (
    per_position_rows,
    score_nonoverlapping,
    score_windows,
    unigram_ppl,
    windows,
)
from posbench.model import LanguageModel, ModelConfig
from posbench.positional import Dimensions
from posbench.positional.nope import NoPE, NoPEConfig
from posbench.runfolder import PER_POSITION, ModelState

VOCAB = 23


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    tiny = ModelConfig(name="tiny", n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    return LanguageModel(tiny, OmegaConf.create({"name": "rope", "theta": 10000.0, "layout": "half"}), VOCAB, 8).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (46,), generator=torch.Generator().manual_seed(1))


def test_windows_cover_every_target_once():
    assert windows(10, 4, 4) == [(0, 4, 0), (4, 4, 0), (8, 2, 0)]
    assert windows(10, 4, 2) == [(0, 4, 0), (2, 4, 2), (4, 4, 2), (6, 4, 2)]
    assert windows(11, 4, 2) == [(0, 4, 0), (2, 4, 2), (4, 4, 2), (6, 4, 2), (8, 3, 2)]
    with pytest.raises(ValueError):
        windows(10, 4, 5)


def test_sliding_with_stride_eval_len_equals_nonoverlapping(model, tokens):
    # reference: the model on each consecutive chunk of 8 inputs, summed by hand
    n = len(tokens) - 1
    ends = [min(s + 8, n) for s in range(0, n, 8)]
    expected = sum(
        model.token_nll(tokens[s:e][None], tokens[s + 1 : e + 1][None]).sum().item()
        for s, e in zip(range(0, n, 8), ends)
    )
    sliding = score_windows(model, tokens, eval_len=8, stride=8, batch_tokens=16, device="cpu")
    assert sliding.tokens == n
    assert sliding.nll * n == pytest.approx(expected, rel=1e-5)
    nonoverlapping = score_nonoverlapping(model, tokens, 8, batch_tokens=1000, device="cpu")
    assert sliding.nll == pytest.approx(nonoverlapping.nll, rel=1e-6)
    torch.testing.assert_close(sliding.count, nonoverlapping.count)


@pytest.mark.parametrize("stride", [1, 3, 5])
def test_sliding_gives_each_target_the_context_of_its_first_window(model, tokens, stride):
    # reference: target t (predicting tokens[t+1]) is scored by window k = max(0, ceil((t - L + 1) / S)),
    # i.e. with inputs tokens[k*S : t+1]
    L, n = 8, len(tokens) - 1
    expected = 0.0
    for t in range(n):
        start = max(0, math.ceil((t - L + 1) / stride)) * stride
        expected += model.token_nll(tokens[start : t + 1][None], tokens[start + 1 : t + 2][None])[0, -1].item()
    score = score_windows(model, tokens, L, stride, batch_tokens=24, device="cpu")
    assert score.tokens == n
    assert score.nll * n == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("stride", [2, 8])
def test_per_position_counts_add_up(model, tokens, stride):
    score = score_windows(model, tokens, 8, stride, batch_tokens=64, device="cpu")
    for exact, bucket in [(8, 1), (3, 2), (0, 5)]:
        rows = per_position_rows(score, exact, bucket)
        assert rows["count"].sum() == len(tokens) - 1
        assert (rows["nll"] * rows["count"]).sum() == pytest.approx(score.nll * score.tokens)
    rows = per_position_rows(score, exact=3, bucket=2)
    if stride == 8:  # 45 targets: five full windows of 8 and one of 5
        assert list(rows["position"]) == [0, 1, 2, 3, 5, 7]
        assert list(rows["count"]) == [6, 6, 6, 12, 10, 5]


class FixedLogits(nn.Module):
    """A model whose next-token logits depend only on the position in the window: [0, 0] before
    ``switch`` (p = 1/2 for either token), [0, ln 3] from ``switch`` on (p(token 0) = 1/4)."""

    precision = "fp32"

    def __init__(self, switch: int):
        super().__init__()
        self.switch = switch
        self.encoding = NoPE(NoPEConfig(), Dimensions(n_heads=1, head_dim=2, d_model=2, train_len=8))
        self.attention = Attention("eager", self.encoding)  # evaluation sets its window (eval.window)

    def token_nll(self, idx, targets):
        logits = torch.zeros(*idx.shape, 2)
        logits[:, self.switch :, 1] = math.log(3)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(idx.shape)

    def num_params(self):
        return 0

    def encoding_parameters(self):
        return list(self.encoding.parameters())


def test_ppl_beyond_on_fixed_logits(tmp_path):
    from posbench.evaluate import evaluate_lengths

    train_len = 4
    stream = torch.zeros(33, dtype=torch.long)  # 32 targets, all token 0
    corpus = Corpus(vocab=["a", "<unk>"], splits={"train": torch.tensor([0, 0, 0, 1]), "test": stream})
    cfg = OmegaConf.merge(
        OmegaConf.structured(Config),
        {"encoding": {"name": "none"}, "train_len": train_len, "eval_lens": [4, 8, 16], "eval": {"splits": ["test"]}},
    )
    results = evaluate_lengths(
        FixedLogits(switch=train_len), corpus, cfg, "cpu", tmp_path, ModelState("run", 1, True)
    ).set_index("eval_len")
    # eval_len 4 = train_len: every target at p = 1/2, no ppl_beyond
    assert results.loc[4, "ppl"] == pytest.approx(2.0)
    assert pd.isna(results.loc[4, "ppl_beyond"])
    # eval_len 8: half the targets at 1/2, half at 1/4 -> ppl 2^1.5; beyond train_len: exactly 4
    assert results.loc[8, "ppl"] == pytest.approx(2**1.5)
    assert results.loc[8, "ppl_beyond"] == pytest.approx(4.0)
    # eval_len 16: a quarter at 1/2, three quarters at 1/4 -> ppl 2^1.75; beyond: 4 still
    assert results.loc[16, "ppl"] == pytest.approx(2**1.75)
    assert results.loc[16, "ppl_beyond"] == pytest.approx(4.0)
    # train frequencies a: 3/4, <unk>: 1/4; every target is a -> 4/3
    assert results["unigram_ppl"].tolist() == pytest.approx([4 / 3] * 3)
    assert set(results["variant"]) == {""} and set(results["stride"]) == {4, 8, 16}
    per_position = pd.read_csv(tmp_path / PER_POSITION)
    at_16 = per_position[per_position["eval_len"] == 16].set_index("position")
    assert at_16["count"].sum() == 32
    assert at_16.loc[3, "nll"] == pytest.approx(math.log(2)) and at_16.loc[4, "nll"] == pytest.approx(math.log(4))


def test_unigram_reference_by_hand():
    vocab = ["a", "b", "<unk>"]
    # train a a b <unk>: p = 1/2, 1/4, 1/4
    assert unigram_ppl(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1]), vocab) == pytest.approx(1 / math.sqrt(1 / 8))
    # no <unk> in train: counted once, so p = 2/4, 1/4, 1/4 again
    assert unigram_ppl(torch.tensor([0, 0, 1]), torch.tensor([2]), vocab) == pytest.approx(4.0)
