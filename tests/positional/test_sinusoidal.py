import math

import torch
from omegaconf import OmegaConf

from posbench.positional import build_encoding, sinusoidal_table


def test_values_at_hand_computed_positions():
    table = sinusoidal_table(3, 4)
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(1 / 100), math.cos(1 / 100)],  # 10000^(2/4) = 100
            [math.sin(2), math.cos(2), math.sin(2 / 100), math.cos(2 / 100)],
        ]
    )
    torch.testing.assert_close(table, expected)


def test_any_length_and_prefix_stable():
    long = sinusoidal_table(5000, 64)
    torch.testing.assert_close(long[:100], sinusoidal_table(100, 64))
    assert long.abs().max() <= 1.0


def test_module_adds_table_to_scaled_embeddings():
    encoding = build_encoding(OmegaConf.create({"name": "sinusoidal"}), n_heads=2, head_dim=8, d_model=16, train_len=8)
    x = torch.randn(2, 30, 16)
    torch.testing.assert_close(encoding.embed(x, torch.arange(30)), x * 4.0 + sinusoidal_table(30, 16))  # sqrt(16) = 4
