"""Checkpoints: plain containers only (tensors, numbers, strings, lists, dicts), loaded with ``weights_only=True``.

A run folder holds two: ``checkpoint.pt``, the best model by validation loss (final evaluation,
``eval``), and ``last.pt``, everything needed to continue training exactly where it stopped.
Both carry ``model`` (a state dict), ``config`` (the resolved config as a plain dict) and ``vocab``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from omegaconf import OmegaConf

from .errors import PosbenchError
from .io import atomic_write
from .runfolder import CHECKPOINT, RESUME_CHECKPOINT

__all__ = ["CHECKPOINT", "RESUME_CHECKPOINT", "check_vocab", "load_checkpoint", "save_checkpoint"]


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write atomically: the previous checkpoint stays intact until the new one is complete."""
    atomic_write(Path(path), lambda tmp: _save(payload, tmp))


def _save(payload: dict, tmp: Path) -> None:
    # Through a Python file, a full disk is an OSError (given a path, torch raises a RuntimeError).
    with open(tmp, "wb") as f:
        torch.save(payload, f)


def unreadable(path: Path, e: Exception) -> PosbenchError:
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return PosbenchError(f"checkpoint {path} is unreadable (truncated or not a checkpoint): {first_line}")


def load_checkpoint(
    path: Path, map_location="cpu", *, encoding: str | None = None, vocab: list[str] | None = None
) -> dict:
    """Load a checkpoint written by posbench, or raise a one-line PosbenchError saying what is wrong.

    ``path`` may be the file or its run folder (then ``checkpoint.pt``). Given ``encoding`` and
    ``vocab``, the checkpoint must have been trained with that encoding on that vocabulary.
    The returned ``config`` is a DictConfig.
    """
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.is_file():
        raise PosbenchError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refuses pickled objects: the message is pages long
        if "Weights only load failed" in str(e):
            raise PosbenchError(
                f"checkpoint {path} holds pickled Python objects, not just tensors and plain containers; "
                "posbench refuses to load it (it could run arbitrary code)"
            ) from None
        raise unreadable(path, e) from None
    except Exception as e:  # a damaged file fails anywhere in the unpickler (EOFError, IndexError, zip errors...)
        raise unreadable(path, e) from None
    if not isinstance(payload, dict) or not {"model", "config", "vocab"} <= payload.keys():
        raise PosbenchError(f"checkpoint {path} is not a posbench checkpoint (needs model, config, vocab)")
    if not isinstance(payload["config"], dict) or not isinstance(payload["vocab"], list):
        raise PosbenchError(f"checkpoint {path} is not a posbench checkpoint (config must be a dict, vocab a list)")
    payload["config"] = OmegaConf.create(payload["config"])
    saved_encoding = OmegaConf.select(payload["config"], "encoding.name")
    if encoding is not None and saved_encoding != encoding:
        raise PosbenchError(f"checkpoint {path} was trained with encoding={saved_encoding}, not encoding={encoding}")
    if vocab is not None:
        check_vocab(payload, vocab, path)
    return payload


def check_vocab(payload: dict, vocab: list[str], path: Path) -> None:
    """Refuse a checkpoint whose vocabulary is not the data's (the token ids would mean other words)."""
    saved = payload["vocab"]
    if saved == list(vocab):
        return
    where = next((i for i, (a, b) in enumerate(zip(saved, vocab)) if a != b), min(len(saved), len(vocab)))
    raise PosbenchError(
        f"checkpoint {path} has a vocabulary of {len(saved):,} words that does not match the data's "
        f"{len(vocab):,} (they first differ at word {where}); was it trained on other data (data.path)?"
    )
