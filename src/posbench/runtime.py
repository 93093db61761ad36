"""Where and how a command computes: the device, CPU threads, RNG state and mixed precision.

``train``, ``eval`` and ``bench`` all take these from here. ``resolve_device`` and
``check_threads`` are pure checks (``config.check_config`` may call them up front);
``set_threads`` is the one that changes torch's settings.
"""

from __future__ import annotations

import random
import re

import torch

from .errors import PosbenchError

DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")


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


def autocast(device):
    """bf16 autocast on CUDA; a no-op context on CPU (fp32 there)."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.device(device).type == "cuda")
