import torch
from omegaconf import OmegaConf

from posbench.positional import alibi_bias, alibi_slopes, build_encoding


def test_slopes_power_of_two_heads():
    expected = torch.tensor([1 / 2**k for k in range(1, 9)])  # paper: 1/2, 1/4, ..., 1/256
    torch.testing.assert_close(alibi_slopes(8), expected)


def test_slopes_six_heads():
    # 4-head series 2^-2, 2^-4, 2^-6, 2^-8, then slopes 0 and 2 of the 8-head series 2^-1 ... 2^-8
    expected = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])
    torch.testing.assert_close(alibi_slopes(6), expected)


def test_slopes_twelve_heads():
    # 8-head series 2^-1 ... 2^-8, then slopes 0, 2, 4, 6 of the 16-head series 2^-0.5k
    expected = torch.tensor([2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5])
    torch.testing.assert_close(alibi_slopes(12), expected)


def test_bias_is_minus_slope_times_distance():
    bias = alibi_bias(2, 3)  # slopes 2^-4, 2^-8
    expected_head0 = -(2.0**-4) * torch.tensor([[0.0, -1, -2], [1, 0, -1], [2, 1, 0]])
    torch.testing.assert_close(bias[0], expected_head0)
    assert bias.shape == (2, 3, 3)


def test_bias_queries_are_the_last_positions():
    bias = alibi_bias(8, q_len=2, k_len=5)
    assert bias.shape == (8, 2, 5)
    # query 0 sits at position 3, so its key 0 is 3 away; query 1 (position 4) sees key 4 at distance 0
    assert bias[0, 0, 0].item() == -0.5 * 3
    assert bias[7, 1, 4].item() == 0.0
    assert bias[7, 1, 0].item() == -(2.0**-8) * 4


def test_module_bias_matches_function():
    encoding = build_encoding(OmegaConf.create({"name": "alibi"}), n_heads=6, head_dim=8, d_model=48, train_len=16)
    pos = torch.arange(7)
    torch.testing.assert_close(encoding.bias(pos, pos), alibi_bias(6, 7))
    assert encoding.is_static and not list(encoding.parameters())


def test_learned_slopes_start_at_reference_and_train():
    cfg = OmegaConf.create({"name": "alibi", "learned_slopes": True})
    encoding = build_encoding(cfg, n_heads=8, head_dim=8, d_model=64, train_len=16)
    (slopes,) = list(encoding.parameters())
    torch.testing.assert_close(slopes.detach(), alibi_slopes(8))
    pos = torch.arange(5)
    encoding.bias(pos, pos).tril().sum().backward()  # the full matrix sums to zero
    assert slopes.grad is not None and slopes.grad.abs().sum() > 0
    assert not encoding.is_static
