"""The kernels of the attention backends (attention.py picks one per pass and plans its masks).

* ``eager_attention``: scores, materialised mask, softmax; the reference and the benchmark baseline.
* ``sdpa_attention``: ``scaled_dot_product_attention`` with the same float mask, or ``is_causal``.
* ``flex_kernel`` with ``bias_score_mod``: FlexAttention, the encoding's bias computed inside the kernel
  (``composed`` with the layer's content terms where they give a ``score_mod``: FoX).
* ``content_attention``: eager, through an encoding's per-layer ``LayerTerms`` (its logits hook and its
  weights in place of softmax); the one kernel that serves encodings that read the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import causal_mask
from .positional import LayerTerms, PositionEncoding
from .variant import AS_TRAINED, AttentionVariant


@dataclass
class Plan:
    """How every layer of one forward pass attends (shared by the layers, built once per pass)."""

    backend: str  # eager | sdpa | flex, after ``auto`` and fallbacks are resolved
    seq_len: int
    dropout_p: float = 0.0  # on the attention weights
    mask: Tensor | None = None  # full (1, H|1, T, T) mask; None: causal flag, flex, or query blocks
    block_mask: object = None  # flex's BlockMask
    query_block: int | None = None  # queries per block when the dense mask would exceed MASK_BUDGET
    batch: int = 1  # sequences in the pass: content terms hold logits for each (``Attention.plan``)
    # The keys each query sees (masks.py): as trained, or the evaluation-time variant's where it cuts some.
    reach: AttentionVariant = AS_TRAINED
    positions: Tensor | None = None  # the tokens' positions (T,) or (B, T), for the encoding's rotation and bias
    #: The positions are the encoding's 0..T-1 (``counting``): masks are kept per length, flex biases by index.
    positions_are_indices: bool = True


def eager_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0) -> Tensor:
    """q (B, H, Q, hd), k and v (B, H, K, hd), mask (1, H|1, Q, K) -> (B, H, Q, hd)."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5 + mask  # (B, H, Q, K)
    return F.dropout(scores.softmax(dim=-1), dropout_p) @ v


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> Tensor:
    """As ``eager_attention``; ``mask=None`` means plain causal (square q and k only).

    Under CPU autocast the fp32 mask stays fp32 (autocast would round it to bf16, where an ALiBi bias at
    distance 16k moves in steps of 64): q, k and v are cast to bf16 here instead, and the CPU kernel adds
    the fp32 mask to its fp32 scores. CUDA's fused kernels need the mask in q's dtype.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(
                q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=mask, dropout_p=dropout_p
            )
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p)


_compiled_flex = None

#: One kernel per (length, encoding): allow more of them than torch's default 8 before it gives up compiling.
FLEX_RECOMPILE_LIMIT = 64


def flex_kernel():
    """``flex_attention`` compiled once per process (uncompiled it materialises every score).

    Static shapes, one kernel per (padded) length: the combination the tests check against eager.
    """
    global _compiled_flex
    if _compiled_flex is None:
        import torch._dynamo.config
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, FLEX_RECOMPILE_LIMIT)
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def bias_score_mod(encoding: PositionEncoding, positions: Tensor | None = None):
    """FlexAttention ``score_mod`` adding the encoding's ``bias_at``; ``None`` without bias.

    ``positions`` (B, T): sequence ``batch`` has its own row of positions; ``None``: the indices are the positions.
    """
    if not encoding.has_bias:
        return None

    def score_mod(score: Tensor, batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + encoding.bias_at(head, q_idx, kv_idx)

    def score_mod_at_positions(score: Tensor, batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + encoding.bias_at(head, positions[batch, q_idx], positions[batch, kv_idx])

    return score_mod if positions is None else score_mod_at_positions


def composed(first, then):
    """The score_mod applying ``first`` and then ``then`` (either may be ``None``: the other alone)."""
    if first is None or then is None:
        return then if first is None else first

    def both(score: Tensor, batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return then(first(score, batch, head, q_idx, kv_idx), batch, head, q_idx, kv_idx)

    return both


def content_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    dropout_p: float,
    terms: LayerTerms,
    state: Tensor | None,
    q_idx: Tensor,
    k_idx: Tensor,
) -> Tensor:
    """As ``eager_attention``, with the layer's ``terms`` making the logits and the weights.

    q_idx (Q,) and k_idx (K,) are the token indices of the queries and keys, by which ``terms`` read ``state``.
    """
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, Q, K)
    logits = terms.logits(scores, mask, q, k, state, q_idx, k_idx)
    return F.dropout(terms.weights(logits), dropout_p) @ v  # (B, H, Q, hd)


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: Plan,
    encoding: PositionEncoding,
    terms: LayerTerms | None = None,
    state: Tensor | None = None,
) -> Tensor:
    """The eager or sdpa backend (eager through ``terms`` where given), with the full mask or one block of
    queries at a time."""

    def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, q_idx: Tensor, k_idx: Tensor) -> Tensor:
        if terms is not None:
            return content_attention(q, k, v, mask, plan.dropout_p, terms, state, q_idx, k_idx)
        return (eager_attention if plan.backend == "eager" else sdpa_attention)(q, k, v, mask, plan.dropout_p)

    if plan.query_block is None:
        k_idx = torch.arange(k.shape[-2], device=q.device)  # the queries are the last of the keys
        return attend(q, k, v, plan.mask, k_idx[k.shape[-2] - q.shape[-2] :], k_idx)
    idx = torch.arange(plan.seq_len, device=q.device)
    bias_positions = None if plan.positions_are_indices else plan.positions
    # Last block first, filled in place: each block then needs no more memory than the one before freed, so
    # the allocator reuses it (first block first, and gathered by torch.cat, glibc's heap grew by every block:
    # 12 GB for DAPE at 16,384 tokens; docs/performance.md).
    out = None
    for s in reversed(range(0, plan.seq_len, plan.query_block)):
        e = min(plan.seq_len, s + plan.query_block)  # queries s..e-1 see the sinks and keys lo..e-1
        lo = max(0, plan.reach.oldest_key(s))  # older keys: hidden from every query here
        sinks = min(plan.reach.sink, lo)  # sink keys before lo (later ones are among lo..e-1)
        keys = torch.cat([idx[:sinks], idx[lo:e]])
        mask = causal_mask(encoding, idx[s:e], keys, plan.reach, bias_positions)  # (B|1, H|1, e-s, K)
        k_seen, v_seen = (k[:, :, lo:e], v[:, :, lo:e]) if sinks == 0 else (k[:, :, keys], v[:, :, keys])
        block = attend(q[:, :, s:e], k_seen, v_seen, mask, idx[s:e], keys)
        if out is None:  # its dtype is the kernel's (bf16 under autocast)
            out = block.new_empty(*block.shape[:2], plan.seq_len, block.shape[-1])  # (B, H, T, hd)
        out[:, :, s:e] = block
    return out
