import pytest
import torch
from omegaconf import OmegaConf

from posbench.positional import build_encoding


def test_table_size_defaults_to_training_length():
    encoding = build_encoding(OmegaConf.create({"name": "learned"}), n_heads=2, head_dim=8, d_model=16, train_len=32)
    assert encoding.max_len == 32
    assert encoding.unsupported_reason(32) is None
    assert "32" in encoding.unsupported_reason(33)
    x = torch.zeros(1, 32, 16)
    torch.testing.assert_close(encoding.embed(x, torch.arange(32))[0], encoding.table.weight)
    with pytest.raises(ValueError):
        encoding.embed(torch.zeros(1, 33, 16), torch.arange(33))


def test_explicit_max_positions():
    cfg = OmegaConf.create({"name": "learned", "max_positions": 100})
    assert build_encoding(cfg, n_heads=2, head_dim=8, d_model=16, train_len=32).unsupported_reason(100) is None
