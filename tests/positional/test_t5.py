import math

import pytest
import torch
from omegaconf import OmegaConf

from posbench.positional import build_encoding, t5_bucket


def reference_bucket(rel: int, num_buckets: int, max_distance: int, bidirectional: bool) -> int:
    """The T5 reference _relative_position_bucket, one Python integer at a time."""
    bucket = 0
    n = -rel
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


SETTINGS = [(32, 128), (16, 64), (8, 20), (64, 1000), (6, 7)]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_buckets,max_distance", SETTINGS)
def test_matches_reference_everywhere(num_buckets, max_distance, bidirectional):
    rel = list(range(-3000, 3001)) + [-(10**6), 10**6, -(2**30), 2**30, -65536, 65536]
    got = t5_bucket(torch.tensor(rel), num_buckets, max_distance, bidirectional)
    expected = torch.tensor([reference_bucket(r, num_buckets, max_distance, bidirectional) for r in rel])
    assert got.dtype == torch.long
    assert torch.equal(got, expected)


def test_hand_worked_causal():
    # max_exact 16; beyond it 16 + floor(log(n/16) / log(8) * 16), capped at 31
    cases = {0: 0, 5: 0, -1: 1, -15: 15, -16: 16, -32: 21, -64: 26, -127: 31, -128: 31, -(10**6): 31}
    for rel, bucket in cases.items():
        assert t5_bucket(torch.tensor(rel)).item() == bucket, rel


def test_hand_worked_bidirectional():
    # 16 buckets a side, max_exact 8; keys after the query offset by 16; 8 + floor(log(n/8) / log(16) * 8)
    cases = {0: 0, -3: 3, 3: 19, 8: 24, -16: 10, -32: 12, 200: 31, -200: 15}
    for rel, bucket in cases.items():
        assert t5_bucket(torch.tensor(rel), bidirectional=True).item() == bucket, rel


def make(n_heads=3, **options):
    return build_encoding(
        OmegaConf.create({"name": "t5", **options}), n_heads=n_heads, head_dim=8, d_model=24, train_len=16
    )


def test_bias_reads_table_at_bucket_and_head():
    encoding = make(num_buckets=8, max_distance=20)
    with torch.no_grad():  # the value names its own (bucket, head)
        encoding.table.copy_(torch.arange(8.0)[:, None] + 100 * torch.arange(3.0)[None, :])
    pos = torch.arange(40)
    bias = encoding.bias(pos, pos)
    for h in range(3):
        for i in range(0, 40, 3):
            for j in range(0, i + 1, 2):
                assert bias[h, i, j].item() == 100 * h + reference_bucket(j - i, 8, 20, False)
    scalar = encoding.bias_at(torch.tensor(2), torch.tensor(30), torch.tensor(1))
    assert scalar.shape == () and scalar.item() == 200 + reference_bucket(-29, 8, 20, False)


def test_only_used_buckets_learn():
    encoding = make()
    assert not encoding.is_static
    pos = torch.arange(5)
    encoding.bias(pos, pos).tril().sum().backward()  # distances 0..4: buckets 0..4
    used = encoding.table.grad.abs().sum(dim=1) > 0
    assert used[:5].all() and not used[5:].any()


@pytest.mark.parametrize("options", [{"num_buckets": 1}, {"num_buckets": 32, "max_distance": 16}])
def test_impossible_settings_raise(options):
    with pytest.raises(ValueError):
        make(**options)
