"""Causal attention: which backend computes softmax(q·kᵀ/√d + bias, causal) · v, and with which masks.
The kernels are in backends.py.

* ``eager``: scores, materialised bias, masked softmax; the reference and the benchmark baseline.
  Encodings with per-layer content terms (``PositionEncoding.layer_terms``) run here, through
  their logits hook and weights (``backends.content_attention``), and on flex where it can serve them.
* ``sdpa``: ``scaled_dot_product_attention``; ``is_causal`` without bias, else a float mask
  built once per length and cached.
* ``flex``: FlexAttention with the bias computed inside the kernel from the encoding's
  ``bias_at`` (never materialised) and a causal block mask cached per length; also the layer's
  content terms where they give a ``score_mod`` (``PositionEncoding.terms_on_flex``: FoX).
* ``auto``: the rule below (``Attention.pick``), set by what ``posbench bench`` measured.

A dense bias grows as T²: past ``MASK_BUDGET`` bytes the eager and sdpa backends build it
for one block of queries at a time, so memory stays linear in the sequence length.

An evaluation-time variant of attention (variant.py: window, blocks, sinks, temperature, log-n), for any
encoding, is set whole by ``Attention.evaluated_as``: its keys are cut by the masks of masks.py, its
scores scaled here.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .backends import Plan, bias_score_mod, composed, dense_attention, flex_kernel
from .cache import LayerCache
from .errors import raise_problems
from .masks import FLEX_BLOCK, causal_block_mask, causal_mask, reaching_block_mask
from .positional import LayerTerms, PositionEncoding
from .variant import AS_TRAINED, AttentionVariant, logn_factors

log = logging.getLogger(__name__)

BACKENDS = ("auto", "sdpa", "flex", "eager")
#: Bytes of fp32 mask (or eager scores) held at once; longer sequences go block by block of queries.
MASK_BUDGET = 256 * 2**20


#: ``auto`` runs flex from this length up for evaluation of bias encodings, where ``bench`` measured it
#: faster than sdpa, and of FoX, faster than eager (docs/performance.md, "Design notes").
FLEX_AUTO_MIN_LEN = 4096

#: ``auto`` trains with eager up to this length on CPU under bf16 autocast without attention dropout,
#: where ``scripts/backend_check.py`` measured it 1-29% faster than sdpa on 2 threads (at 1,024, 4% slower
#: for RoPE); docs/performance.md has the table.
EAGER_AUTO_MAX_TRAIN_LEN = 512


def attention_problems(backend: str, logn_train_len: int | None) -> list[str]:
    """The rules of the attention's config: its backend, and a training length that log-n scaling can divide by."""
    found = []
    if backend not in BACKENDS:
        found.append(f"model.attention must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if logn_train_len is not None and logn_train_len < 2:
        found.append(f"model.logn_scaling needs train_len >= 2 (log(train_len) divides), got {logn_train_len}")
    return found


def computes_terms(encoding: PositionEncoding, backend: str) -> bool:
    """Whether ``backend`` computes the encoding's layer terms, if it has any: eager always, sdpa never, flex (and
    ``auto``, which would pick it) only terms that give a ``score_mod`` (``PositionEncoding.terms_on_flex``)."""
    if not encoding.has_layer_terms or backend == "eager":
        return True
    return backend != "sdpa" and encoding.terms_on_flex


class Attention:
    """The model's attention: rotates q and k, resolves the backend per pass, caches per-length masks.

    ``backend``: one of ``BACKENDS``. ``flex`` falls back to ``sdpa`` (eager for layer terms; one warning)
    where it cannot run: gradients on CPU (FlexAttention has no CPU backward), attention dropout
    (flex has none), or a score_mod that does not compile.

    ``observer``: when set, called as ``observer(q, k, terms, state)`` by every layer in turn with its rotated
    q and k (B, H, T, hd) and its content terms with their state (``None`` without); the attention-anatomy
    probe reads them there (``probes/attention.py``).
    """

    def __init__(
        self,
        backend: str,
        encoding: PositionEncoding,
        train_len: int | None = None,
        variant: AttentionVariant = AS_TRAINED,
    ):
        raise_problems(attention_problems(backend, train_len if variant.logn else None))
        self.backend, self.encoding, self.train_len = backend, encoding, train_len
        self.variant = self.checked(variant)  # as evaluated outside ``evaluated_as``: log-n, if the model has it
        self.score_mod = bias_score_mod(encoding)
        self.flex_broken = False  # set when compiling the encoding's score_mod failed
        self._warned: set[str] = set()
        self._cache: dict[tuple, object] = {}
        self.observer: Callable[[Tensor, Tensor, LayerTerms | None, Tensor | None], None] | None = None

    def checked(self, variant: AttentionVariant) -> AttentionVariant:
        """``variant``, if this attention can serve it (log-n divides by log(train_len))."""
        if variant.logn:
            raise_problems(attention_problems(self.backend, self.train_len or 0))
        return variant

    @contextlib.contextmanager
    def evaluated_as(self, variant: AttentionVariant):
        """Within the block, attend as ``variant`` asks (variant.py)."""
        previous, self.variant = self.variant, self.checked(variant)
        try:
            yield
        finally:
            self.variant = previous

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
        """The backend for one pass: the requested one (flex where it can run, else sdpa, or eager for layer
        terms), or for ``auto``: flex for evaluating a bias encoding, or one whose terms run on flex (FoX), at
        ``FLEX_AUTO_MIN_LEN`` tokens or more, eager for training on CPU in bf16 without attention dropout up to
        ``EAGER_AUTO_MAX_TRAIN_LEN`` tokens, where each was measured faster (docs/performance.md), else sdpa.
        Encodings with layer terms never run on sdpa, nor on flex unless ``terms_on_flex``: eager, whatever was
        asked (one warning)."""
        terms, on_flex = self.encoding.has_layer_terms, self.encoding.terms_on_flex
        if self.backend in ("sdpa", "flex") and not computes_terms(self.encoding, self.backend):
            name = type(self.encoding).__name__
            self.warn_once(f"model.attention={self.backend}: {name} computes per-layer terms; using eager")
            return "eager"
        obstacle = self.flex_obstacle(device, needs_grad, dropout_p)
        if self.backend == "auto":
            in_kernel = on_flex if terms else self.encoding.has_bias  # what flex computes that sdpa cannot
            if in_kernel and seq_len >= FLEX_AUTO_MIN_LEN and not needs_grad and not obstacle:
                return "flex"
            if terms:
                return "eager"
            cpu_bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            eager_train = needs_grad and dropout_p == 0 and seq_len <= EAGER_AUTO_MAX_TRAIN_LEN
            return "eager" if eager_train and device.type == "cpu" and cpu_bf16 else "sdpa"
        if self.backend == "flex" and obstacle:
            self.warn_once(f"model.attention=flex: {obstacle}; using {self.flex_fallback} for these passes")
            return self.flex_fallback
        return self.backend

    @property
    def flex_fallback(self) -> str:
        """The backend of passes that flex cannot serve: sdpa, or eager for layer terms (sdpa cannot compute them)."""
        return "eager" if self.encoding.has_layer_terms else "sdpa"

    def warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning(message)

    def plan(
        self,
        seq_len: int,
        device: torch.device,
        needs_grad: bool,
        dropout_p: float,
        positions: Tensor | None = None,
        batch: int = 1,
    ) -> Plan:
        """How every layer attends in a pass over ``batch`` sequences at ``positions`` (T,) or (B, T) (``None``:
        0..T-1)."""
        backend = self.pick(seq_len, device, needs_grad, dropout_p)
        limited = self.variant.cuts_at(seq_len)
        reach = self.variant if limited else AS_TRAINED
        indices = self.encoding.counting(seq_len, device)
        positions = indices if positions is None else positions
        plan = Plan(backend, seq_len, dropout_p, positions=positions, reach=reach, batch=batch)
        plan.positions_are_indices = positions is indices  # the same tensor: see PositionEncoding.counting
        if backend == "flex":
            padded = -(-seq_len // FLEX_BLOCK) * FLEX_BLOCK
            if not limited:
                plan.block_mask = self.cached(("block", padded, device), lambda: causal_block_mask(padded, device))
            else:
                key = ("block", padded, device, reach)  # the variant is its own key: frozen, hashable
                plan.block_mask = self.cached(key, lambda: reaching_block_mask(padded, reach, device))
            return plan
        if backend == "sdpa" and not self.encoding.has_bias and not limited:
            return plan  # is_causal: no mask at all
        heads = self.encoding.n_heads  # eager's scores have every head even without bias
        rows = len(positions) if positions.dim() == 2 and self.encoding.has_bias else 1  # a bias per sequence
        budget = MASK_BUDGET
        if self.encoding.has_layer_terms:  # several logit-sized tensors at once
            budget /= self.encoding.logit_memory_factor
            # for each sequence of the pass (with gradients every block's stay for the backward pass anyway)
            rows = rows if needs_grad else max(rows, batch)
        if rows * heads * seq_len * seq_len * 4 > budget:
            plan.query_block = max(1, int(budget // (4 * rows * heads * seq_len)))
            return plan
        bias_positions = None if plan.positions_are_indices else positions
        if self.encoding.is_static and (plan.positions_are_indices or not self.encoding.has_bias):
            key = ("mask", seq_len, device, reach)
            plan.mask = self.cached(key, lambda: causal_mask(self.encoding, indices, indices, reach))
        else:  # rebuilt every pass: a learned bias, so that gradients reach it, or a bias at other positions
            bias_positions = None if plan.positions_are_indices else positions
            plan.mask = causal_mask(self.encoding, indices, indices, reach, bias_positions)
        return plan

    def cached(self, key: tuple, build):
        if key not in self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[0] != key[0]}  # keep one length per kind
            self._cache[key] = build()
        return self._cache[key]

    def decoding_plan(self, past: int, new: int, device: torch.device, batch: int = 1) -> Plan:
        """How every layer attends when ``new`` tokens follow ``past`` tokens in a key/value cache (``cache.py``).

        The first pass (``past`` = 0) is planned as any other. Later ones take a dense mask of the new queries
        against every key, the rows of the full pass's mask (``causal_mask``), on eager or sdpa: flex serves
        no query shorter than its block.
        """
        if past == 0:
            return self.plan(new, device, False, 0.0, batch=batch)
        end = past + new
        reach = self.variant if self.variant.cuts_at(end) else AS_TRAINED  # as in ``plan``
        keys = torch.arange(end, device=device)
        eager = self.backend == "eager" or self.encoding.has_layer_terms
        plan = Plan("eager" if eager else "sdpa", new, positions=keys[past:], reach=reach)
        plan.positions_are_indices = False
        plan.mask = causal_mask(self.encoding, keys[past:], keys, reach)  # (1, H|1, new, end)
        return plan

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        plan: Plan,
        cache: LayerCache | None = None,
        terms: LayerTerms | None = None,
        state: Tensor | None = None,
    ) -> Tensor:
        """q, k, v (B, H, T, hd) -> (B, H, T, hd), causal, with the encoding's rotation and bias.

        With ``cache``, the T tokens follow those in it: they attend to its keys too and are added to it.
        ``terms``: the layer's content terms (``PositionEncoding.layer_terms``), with their ``state`` (B, H, T)
        of these tokens (``LayerTerms.prepare``), kept in the cache beside the keys.
        """
        q, k, v, state = self.positioned(q, k, v, plan, cache, state)
        q = self.scaled(q, k.shape[-2])
        if self.observer is not None:
            self.observer(q, k, terms, state)
        if plan.backend == "flex" and not self.flex_broken:
            try:
                return self.flex(q, k, v, plan, terms, state)
            except Exception as e:  # noqa: BLE001 - any compile failure: fall back, as documented
                self.flex_broken = True
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                name = type(self.encoding).__name__
                self.warn_once(f"FlexAttention failed for {name} ({reason}); using {self.flex_fallback}")
        if plan.backend == "flex":  # broken this pass: re-plan without flex (eager for layer terms: ``pick``)
            plan = self.plan(
                plan.seq_len, q.device, torch.is_grad_enabled(), plan.dropout_p, plan.positions, plan.batch
            )
        return dense_attention(q, k, v, plan, self.encoding, terms, state)

    def scaled(self, q: Tensor, seq_len: int) -> Tensor:
        """The queries (the last of ``seq_len`` keys) scaled as the variant asks: log-n past the training
        length, then the temperature tau (tau·q·kᵀ/√d; the encoding's bias is added unscaled)."""
        variant = self.variant
        if variant.logn and seq_len > self.train_len:
            q = q * logn_factors(seq_len, self.train_len, q.device)[-q.shape[-2] :, None].to(q.dtype)
        return q if variant.temperature is None else q * variant.temperature

    def positioned(
        self, q: Tensor, k: Tensor, v: Tensor, plan: Plan, cache: LayerCache | None, state: Tensor | None = None
    ):
        """q and k rotated at their positions, v and the content state; with ``cache``, the keys, values and
        state of every token so far."""
        if cache is None:
            return (*self.encoding.rotate(q, k, plan.positions), v, state)
        if self.encoding.rotates_per_pass:  # cached unrotated; every key turns again with this pass's tables
            k, v, state = cache.extend(k, v, state)
            return (*self.encoding.rotate(q, k, self.encoding.counting(k.shape[-2], q.device)), v, state)
        q, k = self.encoding.rotate(q, k, plan.positions)
        return (q, *cache.extend(k, v, state))

    def flex(
        self, q: Tensor, k: Tensor, v: Tensor, plan: Plan, terms: LayerTerms | None = None, state: Tensor | None = None
    ) -> Tensor:
        """FlexAttention on q, k, v zero-padded to whole blocks (docs/performance.md, "Design notes"), with the
        encoding's bias and the layer's ``terms`` (their ``score_mod`` of ``state``, padded as well).

        Padded keys come after every real query, so the causal mask hides them; the padded
        copies are also contiguous, which the compiled kernel needs.
        """
        pad = plan.block_mask.seq_lengths[0] - plan.seq_len
        padded = [F.pad(t, (0, 0, 0, pad)) for t in (q, k, v)]
        score_mod = self.score_mod
        if not plan.positions_are_indices and score_mod is not None:  # a row of positions per sequence, padded too
            score_mod = bias_score_mod(self.encoding, F.pad(plan.positions.expand(len(q), -1), (0, pad)))
        if terms is not None:  # padded tokens' state: zeros, read only where the block mask hides them
            content = terms.score_mod(F.pad(state, (0, pad)))
            if content is None:  # dropping the terms would be silently wrong: fail, and fall back to eager
                raise TypeError(f"{type(terms).__name__}.score_mod gave None, yet terms_on_flex is set")
            score_mod = composed(score_mod, content)
        out = flex_kernel()(*padded, score_mod=score_mod, block_mask=plan.block_mask)
        return out[:, :, : plan.seq_len]
