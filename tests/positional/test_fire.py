import math

import pytest
import torch
from omegaconf import OmegaConf

from posbench.positional import build_encoding
from posbench.positional import fire as fire_module


def make(n_heads=2, train_len=8, **options):
    cfg = OmegaConf.create({"name": "fire", **options})
    return build_encoding(cfg, n_heads=n_heads, head_dim=8, d_model=8 * n_heads, train_len=train_len)


def reference_bias(encoding, T: int) -> torch.Tensor:
    """f_θ(ψ(i−j)/ψ(max(L, i))) per head, query and key, in float64 Python."""
    c = abs(encoding.c.item())
    L = abs(encoding.threshold_scale.item()) * encoding.init_threshold.item()
    w1, b1, w2, b2 = (p.detach().double().tolist() for p in (encoding.w1, encoding.b1, encoding.w2, encoding.b2))

    def psi(x):
        return math.log(abs(c * x) + 1)

    out = torch.empty(len(b2), T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(T):
            x = psi(i - j) / (psi(max(L, i)) + 1e-6)
            hidden = [max(0.0, x * w + b) for w, b in zip(w1, b1)]
            for h in range(len(b2)):
                out[h, i, j] = sum(a * w for a, w in zip(hidden, w2[h])) + b2[h]
    return out


def test_hand_worked_identity_mlp():
    # c = 1, L = 4, f(x) = relu(x) in head 0 and 2·relu(x) + 0.5 in head 1
    encoding = make(mlp_width=1, init_c=1.0, init_threshold=4.0)
    with torch.no_grad():
        encoding.w1.fill_(1.0), encoding.b1.fill_(0.0)
        encoding.w2.copy_(torch.tensor([[1.0], [2.0]])), encoding.b2.copy_(torch.tensor([0.0, 0.5]))
    bias = encoding.bias(torch.arange(10), torch.arange(10))
    assert math.isclose(bias[0, 2, 0].item(), math.log(3) / math.log(5), rel_tol=1e-5)  # i < L: normaliser ψ(4)
    assert math.isclose(bias[0, 8, 0].item(), 1.0, rel_tol=1e-5)  # ψ(8)/ψ(8)
    assert math.isclose(bias[0, 8, 4].item(), math.log(5) / math.log(9), rel_tol=1e-5)
    assert math.isclose(bias[1, 8, 4].item(), 2 * math.log(5) / math.log(9) + 0.5, rel_tol=1e-5)
    assert bias[1, 5, 5].item() == 0.5  # distance 0


def test_bias_and_bias_at_match_reference(monkeypatch):
    torch.manual_seed(0)
    encoding = make(n_heads=3, train_len=6)
    with torch.no_grad():
        encoding.c.fill_(0.7), encoding.threshold_scale.fill_(1.3)  # away from the initial values
    expected = reference_bias(encoding, 20).float()
    pos = torch.arange(20)
    monkeypatch.setattr(fire_module, "PAIRS_PER_BLOCK", 50)  # several query blocks
    torch.testing.assert_close(encoding.bias(pos, pos), expected)
    heads = torch.arange(3)[:, None, None]
    torch.testing.assert_close(encoding.bias_at(heads, pos[None, :, None], pos[None, None, :]), expected)
    scalar = encoding.bias_at(torch.tensor(2), torch.tensor(17), torch.tensor(4))
    assert scalar.shape == () and math.isclose(scalar.item(), expected[2, 17, 4].item(), rel_tol=1e-5)


def test_initialisation():
    torch.manual_seed(0)
    encoding = make(n_heads=4, train_len=64)
    assert encoding.c.item() == pytest.approx(0.1) and encoding.threshold_scale.item() == 1.0
    assert encoding.init_threshold.item() == 16.0  # null: the paper's 512 for 2048 training tokens, so 64 / 4
    assert make(init_threshold=512.0).init_threshold.item() == 512.0
    assert encoding.w1.abs().max() <= 1 and encoding.w2.abs().max() <= 32**-0.5  # nn.Linear's U(±1/√fan_in)
    assert encoding.w1.abs().max() > 0.5 and encoding.w2.abs().max() > 0.5 * 32**-0.5


def test_training_queries_past_the_default_threshold_take_the_progressive_normaliser():
    """train_len 64, default init: L = 16, so query 40 of a training sequence is normalised by ψ(40), not ψ(L)."""
    encoding = make(mlp_width=1, train_len=64)  # c = 0.1, L = 64 / 4
    with torch.no_grad():  # f(x) = x in head 0, 3x - 1 in head 1: the bias shows the normalised distance
        encoding.w1.fill_(1.0), encoding.b1.fill_(0.0)
        encoding.w2.copy_(torch.tensor([[1.0], [3.0]])), encoding.b2.copy_(torch.tensor([0.0, -1.0]))
    bias = encoding.bias(torch.arange(64), torch.arange(64))
    for i, j in [(40, 0), (40, 13), (63, 1), (16, 0)]:  # i >= L: ψ(i − j) / ψ(i)
        x = math.log(0.1 * (i - j) + 1) / (math.log(0.1 * i + 1) + 1e-6)
        assert bias[0, i, j].item() == pytest.approx(x, rel=1e-5)
        assert bias[1, i, j].item() == pytest.approx(3 * x - 1, rel=1e-5)
    assert bias[0, 40, 0].item() == pytest.approx(1.0, rel=1e-5)  # the farthest key of every query past L maps to 1
    x = math.log(0.1 * 9 + 1) / (math.log(0.1 * 16 + 1) + 1e-6)  # i = 10 < L: ψ(L) normalises
    assert bias[0, 10, 1].item() == pytest.approx(x, rel=1e-5)


def test_a_checkpoint_from_before_the_stored_threshold_keeps_its_training_length():
    """Runs saved without L₀ started from L₀ = train_len; loading one must not move it to train_len / 4."""
    saved = make(train_len=64).state_dict()
    legacy = {k: v for k, v in saved.items() if k != "init_threshold"}
    encoding = make(train_len=64)
    encoding.load_state_dict(legacy)
    assert encoding.init_threshold.item() == 64.0
    encoding.load_state_dict(saved)
    assert encoding.init_threshold.item() == 16.0
    explicit = make(train_len=64, init_threshold=8.0)
    explicit.load_state_dict(legacy)
    assert explicit.init_threshold.item() == 8.0  # a configured L₀ meant the same then


def test_every_parameter_learns():
    encoding = make(train_len=8)
    assert not encoding.is_static
    pos = torch.arange(16)  # queries both below and above the threshold 8
    (encoding.bias(pos, pos).tril() ** 2).sum().backward()
    for name, p in encoding.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_c_and_threshold_enter_as_magnitudes():
    # the paper's |c·x| and |s·L₀|: an optimizer step past zero flips nothing
    encoding = make()
    pos = torch.arange(12)
    before = encoding.bias(pos, pos).detach()
    with torch.no_grad():
        encoding.c.neg_(), encoding.threshold_scale.neg_()
    torch.testing.assert_close(encoding.bias(pos, pos), before)


@pytest.mark.parametrize(
    "options", [{"mlp_width": 0}, {"init_c": 0.0}, {"init_threshold": 0.0}, {"init_threshold": -1.0}]
)
def test_impossible_settings_raise(options):
    with pytest.raises(ValueError):
        make(**options)
