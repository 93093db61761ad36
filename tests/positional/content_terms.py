"""What the reference tests of content encodings (test_cope.py, test_dape.py) compute on posbench's side."""

from __future__ import annotations

import torch

from posbench.attention import Attention
from posbench.masks import causal_mask


def terms_pass(q, k, v, encoding, terms):
    """posbench's logits and weights through a layer's content ``terms`` (on the full causal mask) and its
    attention output (planned as the model plans it: query blocks when MASK_BUDGET says so), for the reference
    tests of content encodings (tests/positional)."""
    idx = torch.arange(q.shape[2])
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    logits = terms.logits(scores, causal_mask(encoding, idx, idx), q, k, None, idx, idx)
    attention = Attention("auto", encoding)
    out = attention(q, k, v, attention.plan(q.shape[2], q.device, True, 0.0), None, terms, None)
    return logits, terms.weights(logits), out
