"""Word-level WikiText: whitespace tokens, ``<eos>`` at every line end, vocabulary from train.

The default source is the Hugging Face dataset; ``data.path`` reads a local folder with
``train.txt``/``valid.txt``/``test.txt`` (or ``wiki.{train,valid,test}.tokens``) instead.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional
from urllib.parse import urlparse

import torch
from torch import Tensor

from .errors import PosbenchError

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
EOS, UNK = "<eos>", "<unk>"


@dataclass
class DataConfig:
    name: str = "wikitext2"
    #: Hugging Face dataset id and config, used when ``path`` is not set.
    hf_path: str = "Salesforce/wikitext"
    hf_name: str = "wikitext-2-v1"
    #: Local folder with the three splits; overrides the hub.
    path: Optional[str] = None


@dataclass
class Corpus:
    vocab: list[str]
    splits: dict[str, Tensor]  # split -> 1-D LongTensor of token ids

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def tokenize(lines: Iterable[str]) -> list[str]:
    return [word for line in lines for word in line.split() + [EOS]]


def build_corpus(lines_by_split: dict[str, Iterable[str]]) -> Corpus:
    words = {split: tokenize(lines) for split, lines in lines_by_split.items()}
    index: dict[str, int] = {}
    for word in words["train"]:
        index.setdefault(word, len(index))
    index.setdefault(UNK, len(index))  # words unseen in train (only in data slices) map here
    unk = index[UNK]
    splits = {split: torch.tensor([index.get(w, unk) for w in ws], dtype=torch.long) for split, ws in words.items()}
    return Corpus(vocab=list(index), splits=splits)


def _local_split_file(folder: Path, split: str) -> Path:
    for name in (f"{split}.txt", f"wiki.{split}.tokens"):
        if (folder / name).is_file():
            return folder / name
    raise PosbenchError(f"data folder {folder} has no {split} split (expected {split}.txt or wiki.{split}.tokens)")


def _read_local(folder: Path) -> dict[str, list[str]]:
    if not folder.is_dir():
        raise PosbenchError(f"data folder {folder} does not exist (data.path)")
    lines = {split: _local_split_file(folder, split).read_text(encoding="utf-8").splitlines() for split in SPLITS}
    if not any(line.strip() for line in lines["train"]):
        raise PosbenchError(f"the train split in {folder} is empty")
    return lines


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so that an offline machine fails at once instead of after minutes of retries."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _read_hub(cfg: DataConfig) -> dict[str, list[str]]:
    offline_hint = "offline? pass data.path=DIR, a folder with train.txt/valid.txt/test.txt"
    cached = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    if not cached and not _hub_reachable():
        raise PosbenchError(
            f"cannot reach the Hugging Face Hub to load {cfg.hf_path} ({cfg.hf_name}); {offline_hint} "
            "(or set HF_HUB_OFFLINE=1 to use a cached copy)"
        )
    try:
        import datasets

        ds = datasets.load_dataset(cfg.hf_path, cfg.hf_name)
    except Exception as e:  # the hub raises many types when offline; all mean the same to the user
        raise PosbenchError(
            f"cannot load {cfg.hf_path} ({cfg.hf_name}) from the Hugging Face Hub ({type(e).__name__}); {offline_hint}"
        ) from None
    names = {"train": "train", "valid": "validation", "test": "test"}
    return {split: ds[names[split]]["text"] for split in SPLITS}


def load_corpus(cfg: DataConfig) -> Corpus:
    lines = _read_local(Path(cfg.path).expanduser()) if cfg.path else _read_hub(cfg)
    corpus = build_corpus(lines)
    log.info(
        "data: %s, vocab %d, tokens %s",
        cfg.path or f"{cfg.hf_path}/{cfg.hf_name}",
        corpus.vocab_size,
        {s: len(t) for s, t in corpus.splits.items()},
    )
    return corpus
