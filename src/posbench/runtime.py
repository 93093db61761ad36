"""Where and how a command computes: the device, CPU threads, RNG state and mixed precision.

``train``, ``eval`` and ``bench`` all take these from here. ``resolve_device``, ``check_threads``
and ``check_precision`` are pure checks (``config.check_config`` may call them up front);
``set_threads`` is the one that changes torch's settings.

Precision: ``fp32``, or ``bf16`` (the forward pass under bfloat16 autocast; weights, optimizer
state, loss and log-softmax stay fp32). ``auto`` is bf16 where the hardware computes it natively
(CUDA; CPUs with avx512_bf16 or AMX) and fp32 elsewhere, where emulated bf16 is slower than fp32.

``freed_memory_kept`` is how training steps avoid page faults on glibc (docs/performance.md);
``signals_deferred`` lets the training loop save its state before SIGINT or SIGTERM stops it.
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
import random
import re
import signal
import threading
from pathlib import Path

import torch

from .errors import PosbenchError

# glibc's mallopt parameters (malloc.h) and the values glibc settles on by itself on 64-bit Linux
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
GLIBC_SETTLED = {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 64 << 20}

DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")
PRECISIONS = ("auto", "fp32", "bf16")
#: /proc/cpuinfo flags of CPUs that compute bfloat16 matmuls natively.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``; a PosbenchError for anything else."""
    name = str(name)
    if not DEVICE_NAME.fullmatch(name):
        raise PosbenchError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PosbenchError(f"device={name} but this torch build or machine has no CUDA; use device=cpu or device=auto")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise PosbenchError(
            f"device={name} but this machine has {torch.cuda.device_count()} CUDA device(s); "
            "use device=cuda or an index below that"
        )
    return device


def check_threads(n) -> None:
    """``null`` (torch's default) or a positive number of torch CPU threads."""
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise PosbenchError(f"threads must be a positive integer or null, got {n}")


def set_threads(n: int | None) -> None:
    check_threads(n)
    if n is not None:
        torch.set_num_threads(n)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def check_precision(name) -> None:
    if name not in PRECISIONS:
        raise PosbenchError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())


def native_bf16_flag() -> str | None:
    """The flag that says this CPU computes bf16 natively (``avx512_bf16``, ``amx_bf16``), or None."""
    flags = cpu_flags()
    return next((flag for flag in NATIVE_BF16_FLAGS if flag in flags), None)


def resolve_precision(name: str, device) -> tuple[str, str]:
    """(``fp32`` or ``bf16``, why) for ``precision=name`` on ``device``."""
    check_precision(name)
    on_cpu = torch.device(device).type == "cpu"
    flag = native_bf16_flag() if on_cpu else None
    lacking = f"this CPU has none of {', '.join(NATIVE_BF16_FLAGS)}"
    if name == "bf16" and on_cpu and not flag:  # said: two orders of magnitude slower than fp32
        return name, f"precision=bf16, emulated: {lacking}"
    if name != "auto":
        return name, f"precision={name}"
    if not on_cpu:
        return "bf16", "precision=auto on CUDA"
    if flag:
        return "bf16", f"precision=auto: this CPU has {flag}"
    return "fp32", f"precision=auto: {lacking} (bf16 would be emulated)"


def legacy_precision(device) -> str:
    """What runs made before the ``precision`` key computed in: bf16 autocast on CUDA, fp32 on CPU."""
    return "bf16" if torch.device(device).type == "cuda" else "fp32"


def autocast(device, precision: str):
    """bf16 autocast for ``precision=bf16`` (resolved, not ``auto``); a no-op context for fp32."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


@contextlib.contextmanager
def freed_memory_kept():
    """Inside: glibc keeps freed memory for reuse instead of returning it to the system.

    By default glibc maps every block above 32 MiB afresh and unmaps it when freed, so each training
    step page-faults on its logits and gradients anew. Kept, they come from the heap and are reused
    (training steps 1.6-1.9x faster in bf16 on this project's CPU), at the price of holding its
    peak. On leaving, the values glibc settles on by itself come back (fixed: its dynamic threshold stays
    off once set) and the kept memory is released, so evaluation,
    whose buffers grow with the length, keeps its smaller peak. A no-op where the C library is not glibc.
    """
    libc = ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # an int: the most the call takes
    try:
        yield
    finally:
        for parameter, value in GLIBC_SETTLED.items():
            libc.mallopt(parameter, value)
        libc.malloc_trim(0)


@contextlib.contextmanager
def signals_deferred():
    """SIGINT/SIGTERM only set a flag (the loop checkpoints, then stops); a second one stops at once."""
    caught: list[str] = []

    def handler(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield caught
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
