"""Causal attention backends, all computing the same thing: softmax(q·kᵀ/√d + bias, causal) · v.

* ``eager``: scores, materialised bias, masked softmax; the reference and the benchmark baseline.
* ``sdpa``: ``scaled_dot_product_attention``; ``is_causal`` without bias, else a float mask
  built once per length and cached.
* ``flex``: FlexAttention with the bias computed inside the kernel from the encoding's
  ``bias_at`` (never materialised) and a causal block mask cached per length.
* ``auto``: the rule below (``Attention.pick``), set by what ``posbench bench`` measured.

A dense bias grows as T²: past ``MASK_BUDGET`` bytes the eager and sdpa backends build it
for one block of queries at a time, so memory stays linear in the sequence length.

Evaluation-time variants of attention (``Attention.evaluated_as``), for any encoding:

* ``window`` W (``eval.window``): every query attends to its last W keys (the window counterfactual);
* ``blockwise`` W (``eval.blockwise``): blockwise causal attention (Sun et al., 2022, arXiv:2212.10554,
  used there with xPos at inference): positions are cut into blocks of W and every query attends to
  the keys of its own block and of the previous one;
* ``temperature`` tau (``eval.attn_temperature``): q·kᵀ/√d multiplied by tau (Wang et al., 2024,
  arXiv:2404.12224, scale λ·q·kᵀ/√d as there); the encoding's bias is not scaled;
* ``sink`` S (``eval.sink``), with a window or blocks: the sequence's first S keys stay visible to every
  query beside them (the attention sinks of Xiao et al., 2023, arXiv:2309.17453, which a window evicts).

Window and blockwise both give every query a first visible key (``oldest_key``), sinks aside: a causal
mask cut there in eager and sdpa, a BlockMask of the same rule in flex.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .cache import LayerCache
from .errors import raise_problems
from .positional import PositionEncoding

log = logging.getLogger(__name__)

BACKENDS = ("auto", "sdpa", "flex", "eager")
#: Bytes of fp32 mask (or eager scores) held at once; longer sequences go block by block of queries.
MASK_BUDGET = 256 * 2**20


def oldest_key(q_pos, window: int | None = None, blockwise: int | None = None):
    """The first key index that query index ``q_pos`` (an int or an integer tensor) attends to;
    0 or less: every key before it. Never decreases with q.

    ``window`` W: its last W keys, itself included. ``blockwise`` W: the keys of its own block
    [W·b, W·(b+1)) and of the previous block, b = q // W. Both: the keys both allow.
    """
    by_window = q_pos * 0 if window is None else q_pos - window + 1
    by_block = q_pos * 0 if blockwise is None else (q_pos // blockwise - 1) * blockwise
    return torch.maximum(by_window, by_block) if isinstance(q_pos, Tensor) else max(by_window, by_block)


def causal_mask(
    encoding: PositionEncoding,
    q_idx: Tensor,
    k_idx: Tensor,
    window: int | None = None,
    blockwise: int | None = None,
    positions: Tensor | None = None,
    sink: int = 0,
) -> Tensor:
    """Float mask (1, H, Q, K) for the queries at indices ``q_idx`` (Q,) and the keys at ``k_idx`` (K,) of a
    sequence — (1, 1, Q, K) without bias: the bias where k ≤ q, -inf above.

    The bias is that of the tokens' ``positions`` (T,), or (B, T) for a mask (B, H, Q, K) with one bias per
    sequence; ``None``: the indices are the positions. With ``window`` or ``blockwise``, also -inf before each
    query's ``oldest_key``, except at the first ``sink`` key indices. Built in fp32 (bias at large distances
    loses precision in bf16). The leading 1 matters: SDPA's fast CPU kernel takes a 4-D mask, while (H, Q, K)
    silently falls to the math path.
    """
    hidden = k_idx[None, :] > q_idx[:, None]  # (Q, K)
    if window is not None or blockwise is not None:
        hidden |= (k_idx[None, :] < oldest_key(q_idx, window, blockwise)[:, None]) & (k_idx[None, :] >= sink)
    if not encoding.has_bias:
        return torch.zeros(1, 1, *hidden.shape, device=q_idx.device).masked_fill(hidden, float("-inf"))
    if positions is None:
        bias = encoding.bias(q_idx, k_idx)[None]
    elif positions.dim() == 1:
        bias = encoding.bias(positions[q_idx], positions[k_idx])[None]
    else:  # a bias per sequence
        bias = torch.stack([encoding.bias(row[q_idx], row[k_idx]) for row in positions])  # (B, H, Q, K)
    return bias.float().masked_fill(hidden, float("-inf"))


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


def causal(batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    return q_idx >= kv_idx


#: ``auto`` runs flex from this length up for evaluation of bias encodings, where ``bench`` measured it
#: faster than sdpa (docs/performance.md, "Design notes").
FLEX_AUTO_MIN_LEN = 4096

#: ``auto`` trains with eager up to this length on CPU under bf16 autocast without attention dropout,
#: where ``scripts/backend_check.py`` measured it 1-29% faster than sdpa on 2 threads (at 1,024, 4% slower
#: for RoPE); docs/performance.md has the table.
EAGER_AUTO_MAX_TRAIN_LEN = 512

#: FlexAttention's block size; flex sequences are padded to a multiple of it (``Attention.flex``).
FLEX_BLOCK = 128


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


def reaching(window: int | None, blockwise: int | None, sink: int = 0):
    """Flex ``mask_mod``: query q sees keys ``oldest_key(q)`` .. q and the first ``sink`` keys."""

    def mask_mod(batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx >= kv_idx) & ((kv_idx >= oldest_key(q_idx, window, blockwise)) | (kv_idx < sink))

    return mask_mod


def reaching_block_mask(
    seq_len: int,
    window: int | None,
    blockwise: int | None,
    device: torch.device,
    block: int = FLEX_BLOCK,
    sink: int = 0,
):
    """Flex's BlockMask of ``reaching``, written down directly like ``causal_block_mask``: query
    block i sees the key blocks holding sinks, then those from the one holding its first query's
    oldest key up to i, each through ``reaching`` (so no T×T grid is ever evaluated)."""
    from torch.nn.attention.flex_attention import BlockMask

    n = -(-seq_len // block)
    rows = torch.arange(n, device=device, dtype=torch.int32)
    lowest = oldest_key(rows * block, window, blockwise).clamp(min=0) // block  # (n,)
    sinks = lowest.clamp(max=-(-sink // block))  # (n,): sink blocks before row i's lowest
    column = rows[None, :]
    # (n, n): row i's first sinks[i] + i - lowest[i] + 1 are used: 0 .. sinks - 1, then lowest .. i
    indices = torch.where(column < sinks[:, None], column, lowest[:, None] + column - sinks[:, None]).clamp(max=n - 1)
    return BlockMask.from_kv_blocks(
        (sinks + rows - lowest + 1)[None, None],
        indices[None, None].contiguous(),
        BLOCK_SIZE=block,
        mask_mod=reaching(window, blockwise, sink),
        seq_lengths=(seq_len, seq_len),
    )


def logn_factors(seq_len: int, train_len: int, device=None) -> Tensor:
    """(seq_len,) query scales of log-n attention scaling: log(n + 1) / log(train_len) at positions
    n >= train_len, 1 before, so a model is unchanged on the lengths it was trained on.

    Chiang & Cholak, 2022, "Overcoming a Theoretical Limitation of Self-Attention" (arXiv:2202.12172),
    scale attention logits by log n so that attention does not flatten as n grows; this variant
    normalises by log(train_len) and applies only past the training length.
    """
    n = torch.arange(seq_len, device=device, dtype=torch.float32)
    return (torch.log(n + 1) / math.log(train_len)).clamp(min=1.0)


@dataclass
class Plan:
    """How every layer of one forward pass attends (shared by the layers, built once per pass)."""

    backend: str  # eager | sdpa | flex, after ``auto`` and fallbacks are resolved
    seq_len: int
    dropout_p: float = 0.0  # on the attention weights
    mask: Tensor | None = None  # full (1, H|1, T, T) mask; None: causal flag, flex, or query blocks
    block_mask: object = None  # flex's BlockMask
    query_block: int | None = None  # queries per block when the dense mask would exceed MASK_BUDGET
    # Each query's oldest key (``oldest_key``; ``Attention.evaluated_as``); both None: all before it.
    window: int | None = None
    blockwise: int | None = None
    sink: int = 0  # the first keys, visible to every query whatever the window or blocks cut
    positions: Tensor | None = None  # the tokens' positions (T,) or (B, T), for the encoding's rotation and bias
    #: The positions are the encoding's 0..T-1 (``counting``): masks are kept per length, flex biases by index.
    positions_are_indices: bool = True


def attention_problems(backend: str, logn_train_len: int | None) -> list[str]:
    """The rules of the attention's config: its backend, and a training length that log-n scaling can divide by."""
    found = []
    if backend not in BACKENDS:
        found.append(f"model.attention must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if logn_train_len is not None and logn_train_len < 2:
        found.append(f"model.logn_scaling needs train_len >= 2 (log(train_len) divides), got {logn_train_len}")
    return found


class Attention:
    """The model's attention: rotates q and k, resolves the backend per pass, caches per-length masks.

    ``backend``: one of ``BACKENDS``. ``flex`` falls back to ``sdpa`` (one warning) where it
    cannot run: gradients on CPU (FlexAttention has no CPU backward), attention dropout
    (flex has none), or a score_mod that does not compile.

    ``observer``: when set, called as ``observer(q, k)`` by every layer in turn with its rotated
    q and k (B, H, T, hd); the attention-anatomy probe reads them there (``probes/attention.py``).
    """

    def __init__(self, backend: str, encoding: PositionEncoding, logn_train_len: int | None = None):
        raise_problems(attention_problems(backend, logn_train_len))
        self.backend, self.encoding, self.logn_train_len = backend, encoding, logn_train_len
        self.score_mod = bias_score_mod(encoding)
        self.flex_broken = False  # set when compiling the encoding's score_mod failed
        self._warned: set[str] = set()
        self._cache: dict[tuple, object] = {}
        # Evaluation-time variants, set by ``evaluated_as``; None: as trained.
        self.window: int | None = None
        self.blockwise: int | None = None
        self.temperature: float | None = None
        self.sink = 0
        self.observer: Callable[[Tensor, Tensor], None] | None = None

    @contextlib.contextmanager
    def evaluated_as(
        self,
        window: int | None = None,
        blockwise: int | None = None,
        temperature: float | None = None,
        sink: int = 0,
    ):
        """Within the block, attend as an evaluation-time variant asks (module docstring; ``None``: as
        trained): each query sees its last ``window`` keys, or its own and the previous block of
        ``blockwise`` positions, and the first ``sink`` keys; ``temperature`` multiplies q·kᵀ/√d."""
        previous = self.window, self.blockwise, self.temperature, self.sink
        self.window, self.blockwise, self.temperature, self.sink = window, blockwise, temperature, sink
        try:
            yield
        finally:
            self.window, self.blockwise, self.temperature, self.sink = previous

    def flex_obstacle(self, device: torch.device, needs_grad: bool, dropout_p: float) -> str | None:
        """Why flex cannot serve this pass, or ``None`` if it can."""
        if self.flex_broken:
            return "FlexAttention could not compile this encoding's bias"
        if needs_grad and device.type == "cpu":
            return "FlexAttention has no backward on CPU"
        if dropout_p > 0:
            return "FlexAttention has no attention dropout"
        return None

    def pick(self, seq_len: int, device: torch.device, needs_grad: bool, dropout_p: float) -> str:
        """The backend for one pass: the requested one (flex where it can run), or for ``auto``:
        flex for evaluating a bias encoding at ``FLEX_AUTO_MIN_LEN`` tokens or more, eager for training
        on CPU in bf16 without attention dropout up to ``EAGER_AUTO_MAX_TRAIN_LEN`` tokens, where each
        was measured faster than sdpa (docs/performance.md), else sdpa."""
        obstacle = self.flex_obstacle(device, needs_grad, dropout_p)
        if self.backend == "auto":
            long_bias_eval = self.encoding.has_bias and seq_len >= FLEX_AUTO_MIN_LEN
            if long_bias_eval and not obstacle and not needs_grad:
                return "flex"
            cpu_bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            eager_train = needs_grad and dropout_p == 0 and seq_len <= EAGER_AUTO_MAX_TRAIN_LEN
            return "eager" if eager_train and device.type == "cpu" and cpu_bf16 else "sdpa"
        if self.backend == "flex" and obstacle:
            self.warn_once(f"model.attention=flex: {obstacle}; using sdpa for these passes")
            return "sdpa"
        return self.backend

    def warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning(message)

    def plan(
        self, seq_len: int, device: torch.device, needs_grad: bool, dropout_p: float, positions: Tensor | None = None
    ) -> Plan:
        """How every layer attends in a pass over sequences at ``positions`` (T,) or (B, T) (``None``: 0..T-1)."""
        backend = self.pick(seq_len, device, needs_grad, dropout_p)
        # A limit that cuts no key at this length (the last query sees key 0) is plain causal attention.
        limited = oldest_key(seq_len - 1, self.window, self.blockwise) > 0
        reach = dict(window=self.window, blockwise=self.blockwise, sink=self.sink) if limited else {}
        indices = self.encoding.counting(seq_len, device)
        positions = indices if positions is None else positions
        plan = Plan(backend, seq_len, dropout_p, positions=positions, **reach)
        plan.positions_are_indices = positions is indices  # the same tensor: see PositionEncoding.counting
        if backend == "flex":
            padded = -(-seq_len // FLEX_BLOCK) * FLEX_BLOCK
            if not limited:
                plan.block_mask = self.cached(("block", padded, device), lambda: causal_block_mask(padded, device))
            else:
                key = ("block", padded, device, self.window, self.blockwise, self.sink)
                plan.block_mask = self.cached(key, lambda: reaching_block_mask(padded, device=device, **reach))
            return plan
        if backend == "sdpa" and not self.encoding.has_bias and not limited:
            return plan  # is_causal: no mask at all
        heads = self.encoding.n_heads  # eager's scores have every head even without bias
        rows = len(positions) if positions.dim() == 2 and self.encoding.has_bias else 1  # a bias per sequence
        if rows * heads * seq_len * seq_len * 4 > MASK_BUDGET:
            plan.query_block = max(1, MASK_BUDGET // (4 * rows * heads * seq_len))
            return plan
        bias_positions = None if plan.positions_are_indices else positions
        build = lambda: causal_mask(self.encoding, indices, indices, positions=bias_positions, **reach)  # noqa: E731
        if self.encoding.is_static and (plan.positions_are_indices or not self.encoding.has_bias):
            plan.mask = self.cached(("mask", seq_len, device, *reach.values()), build)
        else:  # rebuilt every pass: a learned bias, so that gradients reach it, or a bias at other positions
            plan.mask = build()
        return plan

    def cached(self, key: tuple, build):
        if key not in self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[0] != key[0]}  # keep one length per kind
            self._cache[key] = build()
        return self._cache[key]

    def decoding_plan(self, past: int, new: int, device: torch.device) -> Plan:
        """How every layer attends when ``new`` tokens follow ``past`` tokens in a key/value cache (``cache.py``).

        The first pass (``past`` = 0) is planned as any other. Later ones take a dense mask of the new queries
        against every key, the rows of the full pass's mask (``causal_mask``), on eager or sdpa: flex serves
        no query shorter than its block.
        """
        if past == 0:
            return self.plan(new, device, False, 0.0)
        end = past + new
        limited = oldest_key(end - 1, self.window, self.blockwise) > 0  # as in ``plan``
        reach = dict(window=self.window, blockwise=self.blockwise, sink=self.sink) if limited else {}
        keys = torch.arange(end, device=device)
        plan = Plan("eager" if self.backend == "eager" else "sdpa", new, positions=keys[past:], **reach)
        plan.positions_are_indices = False
        plan.mask = causal_mask(self.encoding, keys[past:], keys, **reach)  # (1, H|1, new, end)
        return plan

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, plan: Plan, cache: LayerCache | None = None) -> Tensor:
        """q, k, v (B, H, T, hd) -> (B, H, T, hd), causal, with the encoding's rotation and bias.

        With ``cache``, the T tokens follow those in it: they attend to its keys too and are added to it.
        """
        q, k, v = self.positioned(q, k, v, plan, cache)
        if self.logn_train_len is not None and k.shape[-2] > self.logn_train_len:  # the queries are the last keys
            q = q * logn_factors(k.shape[-2], self.logn_train_len, q.device)[-q.shape[-2] :, None].to(q.dtype)
        if self.temperature is not None:  # tau·q·kᵀ/√d; the encoding's bias is added unscaled
            q = q * self.temperature
        if self.observer is not None:
            self.observer(q, k)
        if plan.backend == "flex" and not self.flex_broken:
            try:
                return self.flex(q, k, v, plan)
            except Exception as e:  # noqa: BLE001 - any compile failure: fall back, as documented
                self.flex_broken = True
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                self.warn_once(f"FlexAttention failed for {type(self.encoding).__name__} ({reason}); using sdpa")
        if plan.backend == "flex":  # broken this pass: re-plan without flex
            plan = self.plan(plan.seq_len, q.device, torch.is_grad_enabled(), plan.dropout_p, plan.positions)
        return self.dense(q, k, v, plan)

    def positioned(self, q: Tensor, k: Tensor, v: Tensor, plan: Plan, cache: LayerCache | None):
        """q and k rotated at their positions; with ``cache``, the keys and values of every token so far."""
        if cache is None:
            return (*self.encoding.rotate(q, k, plan.positions), v)
        if self.encoding.rotates_per_pass:  # cached unrotated; every key turns again with this pass's tables
            k, v = cache.extend(k, v)
            return (*self.encoding.rotate(q, k, self.encoding.counting(k.shape[-2], q.device)), v)
        q, k = self.encoding.rotate(q, k, plan.positions)
        return (q, *cache.extend(k, v))

    def flex(self, q: Tensor, k: Tensor, v: Tensor, plan: Plan) -> Tensor:
        """FlexAttention on q, k, v zero-padded to whole blocks (docs/performance.md, "Design notes").

        Padded keys come after every real query, so the causal mask hides them; the padded
        copies are also contiguous, which the compiled kernel needs.
        """
        pad = plan.block_mask.seq_lengths[0] - plan.seq_len
        padded = [F.pad(t, (0, 0, 0, pad)) for t in (q, k, v)]
        score_mod = self.score_mod
        if not plan.positions_are_indices and score_mod is not None:  # a row of positions per sequence, padded too
            score_mod = bias_score_mod(self.encoding, F.pad(plan.positions.expand(len(q), -1), (0, pad)))
        out = flex_kernel()(*padded, score_mod=score_mod, block_mask=plan.block_mask)
        return out[:, :, : plan.seq_len]

    def dense(self, q: Tensor, k: Tensor, v: Tensor, plan: Plan) -> Tensor:
        """The eager or sdpa backend, with the full mask or one block of queries at a time."""
        attend = eager_attention if plan.backend == "eager" else sdpa_attention
        if plan.query_block is None:
            return attend(q, k, v, plan.mask, plan.dropout_p)
        idx = torch.arange(plan.seq_len, device=q.device)
        bias_positions = None if plan.positions_are_indices else plan.positions
        out = []
        for s in range(0, plan.seq_len, plan.query_block):
            e = min(plan.seq_len, s + plan.query_block)  # queries s..e-1 see the sinks and keys lo..e-1
            lo = max(0, oldest_key(s, plan.window, plan.blockwise))  # older keys: hidden from every query here
            sinks = min(plan.sink, lo)  # sink keys before lo (later ones are among lo..e-1)
            keys = torch.cat([idx[:sinks], idx[lo:e]])
            mask = causal_mask(
                self.encoding, idx[s:e], keys, plan.window, plan.blockwise, bias_positions, plan.sink
            )  # (B|1, H|1, e-s, len(keys))
            k_seen, v_seen = (k[:, :, lo:e], v[:, :, lo:e]) if sinks == 0 else (k[:, :, keys], v[:, :, keys])
            out.append(attend(q[:, :, s:e], k_seen, v_seen, mask, plan.dropout_p))
        return torch.cat(out, dim=2)  # (B, H, T, hd)
