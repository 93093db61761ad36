"""Attention anatomy: where each head looks, and the bias it adds at each distance.

Protocol (``attention_stats``):

* Lengths: train_len, 4 x and 16 x train_len; each is one window of the stream's first eval_len tokens.
  Lengths longer than the stream are dropped with one warning; lengths the encoding cannot serve are
  ``unsupported`` (one row, no layer or head).
* One forward pass per length; ``Attention.observer`` hands every layer's rotated q and k (and its content
  terms with their state, where the encoding has them) to ``head_stats``, which rebuilds that layer's
  attention weights p (the encoding's bias and the causal mask included, through the terms' logits and
  weights) one block of queries at a time, so no L x L matrix per head is ever held.
* Per layer and head: ``entropy`` = mean over queries of -sum_k p log p (nats); ``mean_distance`` =
  mean over queries of sum_k p (q - k); ``mass_beyond_train_len`` = mean over queries at positions
  >= train_len of the weight on keys more than train_len back (NaN where no query is that far in).

``bias_curves``: for bias encodings, b_h(d) of every head at d = 0 and ``BIAS_POINTS`` log-spaced
distances up to 16 x train_len, seen from the query at position 16 x train_len (FIRE's bias depends
on the query's position too; the others on d alone).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ..attention import MASK_BUDGET
from ..masks import causal_mask
from ..positional import LayerTerms, PositionEncoding
from ..variant import AS_TRAINED, AttentionVariant
from . import device_of, within_data

COLUMNS = ["eval_len", "layer", "head", "entropy", "mean_distance", "mass_beyond_train_len", "status", "reason"]
BIAS_COLUMNS = ["head", "distance", "bias"]
#: Log-spaced distances of a bias curve (besides d = 0).
BIAS_POINTS = 64
#: Eval lengths of the anatomy, as multiples of train_len.
MULTIPLES = (1, 4, 16)


@contextlib.contextmanager
def observing(model: nn.Module, observer):
    """Within the block, ``observer(q, k, terms, state)`` sees every layer's rotated q and k, and its content
    terms and their state (``None`` without)."""
    model.attention.observer = observer
    try:
        yield
    finally:
        model.attention.observer = None


@torch.no_grad()
def head_stats(
    encoding: PositionEncoding,
    q: Tensor,
    k: Tensor,
    train_len: int,
    variant: AttentionVariant = AS_TRAINED,
    terms: LayerTerms | None = None,
    state: Tensor | None = None,
) -> dict[str, Tensor]:
    """Entropy, mean distance and mass beyond train_len per head (each (H,), float64) of one sequence's
    attention, q and k (H, T, hd) already rotated (and scaled); see the module for the definitions.
    ``variant``: the one the attention was evaluated in, whose keys it cut (masks.py). ``terms``: the layer's
    content terms, with their ``state`` (1, H, T) of this sequence (``None``: softmax of scores and bias)."""
    heads, length, head_dim = q.shape
    pos = torch.arange(length, device=q.device)
    terms = LayerTerms() if terms is None else terms  # its defaults: scores + bias, softmax
    factor = encoding.logit_memory_factor if encoding.has_layer_terms else 1
    per_block = max(1, int(MASK_BUDGET / factor) // (4 * heads * length))
    entropy, distance, beyond = (torch.zeros(heads, dtype=torch.float64, device=q.device) for _ in range(3))
    for s in range(0, length, per_block):
        e = min(length, s + per_block)  # queries s..e-1 see keys 0..e-1
        scores = (q[None, :, s:e] @ k[None, :, :e].transpose(-2, -1)).float() * head_dim**-0.5  # (1, H, e - s, e)
        mask = causal_mask(encoding, pos[s:e], pos[:e], variant)
        logits = terms.logits(scores, mask, q[None, :, s:e], k[None, :, :e], state, pos[s:e], pos[:e])
        p = terms.weights(logits)[0]  # (H, e - s, e)
        back = (pos[s:e, None] - pos[None, :e]).clamp(min=0)  # (e - s, e)
        entropy += torch.special.entr(p).sum((-1, -2)).double()
        distance += (p * back).sum((-1, -2)).double()
        far = pos[s:e] >= train_len
        beyond += (p[:, far] * (back[far] > train_len)).sum((-1, -2)).double()
    far_queries = max(length - train_len, 0)
    return dict(
        entropy=entropy / length,
        mean_distance=distance / length,
        mass_beyond_train_len=beyond / far_queries if far_queries else torch.full_like(beyond, math.nan),
    )


@torch.no_grad()
def stats_by_layer(model: nn.Module, window: Tensor, train_len: int) -> list[dict[str, Tensor]]:
    """``head_stats`` of every layer of ``model`` reading ``window`` (1-D), in one forward pass, attending
    as the model's evaluation-time variant asks (``Attention.evaluated_as``)."""
    variant = model.attention.variant
    layers: list[dict[str, Tensor]] = []

    def observe(q: Tensor, k: Tensor, terms: LayerTerms | None, state: Tensor | None) -> None:
        state = None if state is None else state[:1]  # (1, H, T)
        layers.append(head_stats(model.encoding, q[0], k[0], train_len, variant, terms, state))

    with observing(model, observe):
        model(window[None].to(device_of(model)))
    return layers


@torch.no_grad()
def attention_stats(model: nn.Module, tokens: Tensor, train_len: int) -> pd.DataFrame:
    """One row per (eval_len, layer, head) of ``model`` reading the start of ``tokens`` (1-D); see the module."""
    model.eval()
    lengths = within_data([train_len * m for m in MULTIPLES], len(tokens), "attention eval_len")
    rows = []
    for eval_len in lengths:
        reason = model.encoding.unsupported_reason(eval_len)
        if reason:
            rows.append(dict(eval_len=eval_len, status="unsupported", reason=reason))
            continue
        for layer, stats in enumerate(stats_by_layer(model, tokens[:eval_len], train_len)):
            values = {name: value.cpu().tolist() for name, value in stats.items()}
            for head in range(len(values["entropy"])):
                per_head = {name: value[head] for name, value in values.items()}
                rows.append(dict(eval_len=eval_len, layer=layer, head=head, **per_head, status="ok", reason=""))
    return pd.DataFrame(rows, columns=COLUMNS)


@torch.no_grad()
def bias_curves(encoding: PositionEncoding, train_len: int, device=None) -> pd.DataFrame:
    """b_h(d) per head of a bias encoding (no rows without bias); see the module."""
    if not encoding.has_bias:
        return pd.DataFrame(columns=BIAS_COLUMNS)
    longest = 16 * train_len
    distances = np.unique(np.r_[0, np.geomspace(1, longest, BIAS_POINTS).round().astype(np.int64)])
    d = torch.from_numpy(distances).to(device)
    heads = torch.arange(encoding.n_heads, device=device)
    bias = encoding.bias_at(heads[:, None], torch.full_like(d, longest)[None, :], (longest - d)[None, :])
    bias = bias.expand(len(heads), len(d)).float().cpu().numpy()
    return pd.DataFrame(
        dict(head=np.repeat(heads.cpu().numpy(), len(d)), distance=np.tile(distances, len(heads)), bias=bias.ravel()),
        columns=BIAS_COLUMNS,
    )
