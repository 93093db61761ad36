"""Decoding speed: a token at a time through the key/value cache (``cache.py``), or a pass over the whole
sequence so far per token."""

from __future__ import annotations

import logging
import statistics
import time

import torch

from ..model import LanguageModel
from ..runtime import autocast
from .timing import PeakRSS, flops_per_token, measured, synced

log = logging.getLogger(__name__)


#: Decoding rows: contexts of train_len times these, batch 1, the last tokens of each timed: up to this many
#: through the cache (each a few milliseconds), and up to this many without it (each a pass over the context).
DECODE_RATIOS = (1, 4, 16)
DECODE_STEPS = {"decode": 32, "decode_nocache": 2}


def decode_steps(phase: str, length: int) -> int:
    """Timed tokens at the end of a context of ``length``: at most half of it, so a cache holds some first."""
    return min(DECODE_STEPS[phase], length // 2)


def time_decoding(model: LanguageModel, cfg, device, name: str, backend: str, peak: float) -> list[dict]:
    """Tokens/s of decoding at train_len x DECODE_RATIOS: ``decode`` through the key/value cache (``cache.py``),
    ``decode_nocache`` with a full pass over the sequence so far per token. FLOPs per token: one token's
    forward against the context with the cache, the whole context's without."""
    rows, gen = [], torch.Generator().manual_seed(cfg.seed)
    for length in (cfg.train_len * ratio for ratio in DECODE_RATIOS):
        base = dict(encoding=name, backend=backend, seq_len=length, batch=1)
        unsupported = model.encoding.unsupported_reason(length)
        if unsupported or length < 4:  # a cache of one token at least, a warm-up step, the timed ones
            status = "unsupported" if unsupported else "skipped"
            reason = unsupported or f"a context of {length} tokens is too short to time decoding steps in"
            rows += [dict(base, phase=phase, status=status, reason=reason) for phase in DECODE_STEPS]
            continue
        tokens = torch.randint(0, cfg.vocab_size, (1, length), generator=gen).to(device)
        speeds = {}
        for phase, cached in (("decode", True), ("decode_nocache", False)):
            flops = flops_per_token(cfg.model, cfg.vocab_size, length, training=False) * (1 if cached else length)
            steps = decode_steps(phase, length)
            with PeakRSS() as mem:
                runs = [decoding_seconds(model, tokens, steps, cached, device) for _ in range(cfg.eval_repeats)]
            speeds[phase] = steps / statistics.median(runs)
            rows.append(measured(dict(base, phase=phase), speeds[phase], flops, peak, mem.extra_mb))
        log.info(
            "decode %s/%s at %d: %.0f tok/s with the cache, %.0f without (x%.1f)",
            *(name, backend, length, speeds["decode"], speeds["decode_nocache"]),
            speeds["decode"] / speeds["decode_nocache"],
        )
    return rows


@torch.no_grad()
def decoding_seconds(model: LanguageModel, tokens: torch.Tensor, steps: int, cached: bool, device) -> float:
    """Seconds to run the last ``steps`` of ``tokens`` (1, L) a token at a time, each one's logits computed: after
    the rest fills a cache (untimed, with one step of warm-up), or each as a pass over every token so far."""
    model.eval()
    start = tokens.shape[1] - steps
    cache = model.new_cache(tokens.shape[1]) if cached else None

    def step(t: int):
        with autocast(device, model.precision):
            hidden = model(tokens[:, t : t + 1], cache=cache) if cached else model(tokens[:, : t + 1])
            return model.head(hidden[:, -1])

    if cached:
        with autocast(device, model.precision):
            model(tokens[:, : start - 1], cache=cache)
    synced(lambda: step(start - 1), device)  # warm-up
    t0 = time.perf_counter()
    for t in range(start, tokens.shape[1]):
        step(t)
    synced(lambda: None, device)
    return time.perf_counter() - t0
