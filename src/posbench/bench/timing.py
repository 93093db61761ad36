"""How bench measures: medians of repeated runs, peak memory, the matmul peak it compares against, FLOPs per
token, and the row of one measurement."""

from __future__ import annotations

import os
import statistics
import threading
import time

import torch

from ..model import ModelConfig


class PeakRSS:
    """Highest resident memory of this process while the block runs, sampled every 2 ms (Linux)."""

    def __enter__(self):
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def median_seconds(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_peak_flops(device: torch.device, precision: str = "fp32", n: int = 2048, repeats: int = 5) -> float:
    """Measured FLOP/s of an n×n matmul in ``precision``: the yardstick for ``peak_fraction``."""
    a, b = (torch.randn(n, n, device=device, dtype=DTYPES[precision]) for _ in range(2))
    return 2 * n**3 / median_seconds(lambda: synced(lambda: a @ b, device), repeats, warmup=2)


def synced(fn, device: torch.device):
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out


def flops_per_token(m: ModelConfig, vocab_size: int, seq_len: int, training: bool) -> float:
    """Matmul FLOPs per token: 2 per weight (tied head counted once), plus causal attention.

    Attention: q·kᵀ and p·v over on average T/2 keys, 2·(T/2)·d each per layer. Training is
    three times the forward pass (backward computes two products per forward product).
    """
    weights = m.n_layers * (4 * m.d_model**2 + 2 * m.d_model * m.d_ff) + m.d_model * vocab_size
    forward = 2 * weights + m.n_layers * 2 * seq_len * m.d_model
    return forward * (3 if training else 1)


def measured(row: dict, tok_s: float, flops: float, peak: float, extra_mb: float) -> dict:
    """A bench row of a measurement: throughput, FLOP rate and its share of the matmul peak, memory."""
    return dict(
        row,
        tokens_per_s=tok_s,
        gflop_per_token=flops / 1e9,
        gflop_per_s=tok_s * flops / 1e9,
        peak_fraction=tok_s * flops / peak,
        peak_mem_mb=extra_mb,
        status="ok",
        reason="",
    )
