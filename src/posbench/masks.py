"""Mask geometry: pure functions from (query and key positions, the encoding's bias, an ``AttentionVariant``)
to a dense float mask, or to FlexAttention's ``mask_mod`` and ``BlockMask``. The backends (attention.py)
only compute with them.

Every query sees the keys at or before it that its variant does not hide (``AttentionVariant.hides``: for
a window or blocks, those before each query's ``oldest_key``, except the first ``sink`` ones). The block
lists of flex and the query blocks of the dense backends skip the keys before ``oldest_key``, which is a
bound every variant keeps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .positional import PositionEncoding
from .variant import AS_TRAINED, AttentionVariant

#: FlexAttention's block size; flex sequences are padded to a multiple of it (``Attention.flex``).
FLEX_BLOCK = 128


def causal_mask(
    encoding: PositionEncoding,
    q_idx: Tensor,
    k_idx: Tensor,
    variant: AttentionVariant = AS_TRAINED,
    positions: Tensor | None = None,
) -> Tensor:
    """Float mask (1, H, Q, K) for the queries at indices ``q_idx`` (Q,) and the keys at ``k_idx`` (K,) of a
    sequence — (1, 1, Q, K) without bias: the bias where k ≤ q, -inf above.

    The bias is that of the tokens' ``positions`` (T,), or (B, T) for a mask (B, H, Q, K) with one bias per
    sequence; ``None``: the indices are the positions. A ``variant`` with a window or blocks also puts -inf
    before each query's ``oldest_key``, except at the first ``sink`` key indices. Built in fp32 (bias at large
    distances loses precision in bf16). The leading 1 matters: SDPA's fast CPU kernel takes a 4-D mask, while
    (H, Q, K) silently falls to the math path.
    """
    hidden = (k_idx[None, :] > q_idx[:, None]) | variant.hides(q_idx[:, None], k_idx[None, :])  # (Q, K)
    if not encoding.has_bias:
        return torch.zeros(1, 1, *hidden.shape, device=q_idx.device).masked_fill(hidden, float("-inf"))
    if positions is None:
        bias = encoding.bias(q_idx, k_idx)[None]
    elif positions.dim() == 1:
        bias = encoding.bias(positions[q_idx], positions[k_idx])[None]
    else:  # a bias per sequence
        bias = torch.stack([encoding.bias(row[q_idx], row[k_idx]) for row in positions])  # (B, H, Q, K)
    return bias.float().masked_fill(hidden, float("-inf"))


def causal(batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return q_idx >= kv_idx


def causal_block_mask(seq_len: int, device: torch.device, block: int = FLEX_BLOCK):
    """Flex's causal BlockMask written down directly: query block i sees key blocks 0..i-1 whole
    and block i through ``causal``. (``create_block_mask`` evaluates the mask on the full T×T
    grid: 2.6 GB at 16,384 tokens.)"""
    from torch.nn.attention.flex_attention import BlockMask

    n = -(-seq_len // block)
    rows = torch.arange(n, device=device, dtype=torch.int32)
    diagonal = torch.zeros(n, n, device=device, dtype=torch.int32)
    diagonal[:, 0] = rows  # (n, n): each row's one partial block first, the rest unused
    below = torch.arange(n, device=device, dtype=torch.int32).expand(n, n).contiguous()  # row i: 0..i-1 are used
    kv_num_blocks = torch.ones(1, 1, n, device=device, dtype=torch.int32)
    return BlockMask.from_kv_blocks(
        kv_num_blocks,
        diagonal[None, None],
        rows[None, None],
        below[None, None],
        BLOCK_SIZE=block,
        mask_mod=causal,
        seq_lengths=(seq_len, seq_len),
    )


def reaching(variant: AttentionVariant):
    """Flex ``mask_mod``: query q sees the keys up to q that ``variant`` does not hide."""

    def mask_mod(batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx >= kv_idx) & ~variant.hides(q_idx, kv_idx)

    return mask_mod


def reaching_block_mask(seq_len: int, variant: AttentionVariant, device: torch.device, block: int = FLEX_BLOCK):
    """Flex's BlockMask of ``reaching``, written down directly like ``causal_block_mask``: query
    block i sees the key blocks holding sinks, then those from the one holding its first query's
    oldest key up to i, each through ``reaching`` (so no T×T grid is ever evaluated)."""
    from torch.nn.attention.flex_attention import BlockMask

    n = -(-seq_len // block)
    rows = torch.arange(n, device=device, dtype=torch.int32)
    lowest = variant.oldest_key(rows * block).clamp(min=0) // block  # (n,)
    sinks = lowest.clamp(max=-(-variant.sink // block))  # (n,): sink blocks before row i's lowest
    column = rows[None, :]
    # (n, n): row i's first sinks[i] + i - lowest[i] + 1 are used: 0 .. sinks - 1, then lowest .. i
    indices = torch.where(column < sinks[:, None], column, lowest[:, None] + column - sinks[:, None]).clamp(max=n - 1)
    return BlockMask.from_kv_blocks(
        (sinks + rows - lowest + 1)[None, None],
        indices[None, None].contiguous(),
        BLOCK_SIZE=block,
        mask_mod=reaching(variant),
        seq_lengths=(seq_len, seq_len),
    )
