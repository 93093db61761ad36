"""Attention kernels. The model hands over q, k, v and (for bias encodings) a float mask."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .positional import PositionEncoding


def causal_bias_mask(encoding: PositionEncoding, seq_len: int, device: torch.device) -> Tensor | None:
    """Float mask (1, H, T, T): the encoding's bias below the diagonal, -inf above; ``None`` without bias.

    Built in fp32 (bias at large distances loses precision in bf16). The leading 1 matters:
    SDPA's fast CPU kernel takes a 4-D mask, while (H, T, T) silently falls to the math path.
    """
    if not encoding.has_bias:
        return None
    pos = torch.arange(seq_len, device=device)
    bias = encoding.bias(pos, pos).float()
    future = pos[None, :] > pos[:, None]
    return bias.masked_fill(future, float("-inf")).unsqueeze(0)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> Tensor:
    """Causal attention of q, k, v (B, H, T, hd); ``mask`` already holds the causal -inf."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p)
