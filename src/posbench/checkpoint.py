"""Checkpoints: plain containers only (weights, config dict, vocabulary), loaded with ``weights_only=True``."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from .errors import PosbenchError
from .io import atomic_write

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write atomically: the previous checkpoint stays intact until the new one is complete."""
    atomic_write(Path(path), lambda tmp: torch.save(payload, tmp))


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """Load a checkpoint written by posbench, or raise a one-line PosbenchError saying what is wrong."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise PosbenchError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PosbenchError(f"checkpoint {path} is unreadable (truncated or not a posbench checkpoint): {reason}") from None
    if not isinstance(payload, dict) or not {"model", "config", "vocab"} <= payload.keys():
        raise PosbenchError(f"checkpoint {path} is not a posbench checkpoint (needs model, config, vocab)")
    payload["config"] = OmegaConf.create(payload["config"])
    return payload
