"""Word-level WikiText: whitespace tokens, ``<eos>`` at every line end, vocabulary from train.

Articles: a title line (stripped ``= Title =``, one ``=`` each side; ``= = Section = =`` is not one) starts
an article. Text before a split's first title belongs to the first title's article, article 0.

Three sources, the first one set wins: ``data.path``, a local folder with ``train.txt``/``valid.txt``/
``test.txt`` (or ``wiki.{train,valid,test}.tokens``); ``data.shipped``, such a folder shipped inside
posbench (``posbench/datasets/``); else the Hugging Face dataset.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from importlib import resources
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
    #: Hugging Face dataset id and config, used when neither ``path`` nor ``shipped`` is set.
    hf_path: str = "Salesforce/wikitext"
    hf_name: str = "wikitext-2-v1"
    #: A data set shipped inside posbench (a folder of ``posbench/datasets/``); overrides the hub.
    shipped: Optional[str] = None
    #: Local folder with the three splits; overrides ``shipped`` and the hub.
    path: Optional[str] = None


@dataclass
class Corpus:
    vocab: list[str]
    splits: dict[str, Tensor]  # split -> 1-D LongTensor of token ids
    #: split -> the index of each article's first token (the first is 0); a split not listed is one article.
    article_starts: dict[str, Tensor] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def article_ids(self, split: str, n_tokens: int) -> Tensor:
        """The article of each of the first ``n_tokens`` tokens of ``split``: (n_tokens,) int64, from 0."""
        starts = self.article_starts.get(split, torch.zeros(1, dtype=torch.long))
        return torch.searchsorted(starts, torch.arange(n_tokens), right=True) - 1


def tokenize(lines: Iterable[str]) -> list[str]:
    return [word for line in lines for word in line.split() + [EOS]]


def is_title(line: str) -> bool:
    """An article title: ``= Title =`` with one ``=`` each side (not a ``= = Section = =`` heading)."""
    text = line.strip()
    if len(text) < 3 or text[0] != "=" or text[-1] != "=":
        return False
    inner = text[1:-1].strip()
    return bool(inner) and inner[0] != "=" and inner[-1] != "="


def article_starts(lines: Iterable[str]) -> list[int]:
    """The token index at which each article begins, as ``tokenize`` numbers tokens: 0, then every title
    after the first (the first title's article is article 0, with whatever text precedes it)."""
    titles, position = [], 0
    for line in lines:
        if is_title(line):
            titles.append(position)
        position += len(line.split()) + 1  # + <eos>
    return [0, *titles[1:]]


def build_corpus(lines_by_split: dict[str, Iterable[str]]) -> Corpus:
    lines_by_split = {split: list(lines) for split, lines in lines_by_split.items()}  # read twice
    words = {split: tokenize(lines) for split, lines in lines_by_split.items()}
    index: dict[str, int] = {}
    for word in words["train"]:
        index.setdefault(word, len(index))
    index.setdefault(UNK, len(index))  # words unseen in train (only in data slices) map here
    unk = index[UNK]
    splits = {split: torch.tensor([index.get(w, unk) for w in ws], dtype=torch.long) for split, ws in words.items()}
    starts = {split: torch.tensor(article_starts(lines), dtype=torch.long) for split, lines in lines_by_split.items()}
    return Corpus(vocab=list(index), splits=splits, article_starts=starts)


def shipped_folder(name: str) -> Path:
    """The folder of the data set ``name`` shipped inside posbench (``data.shipped``)."""
    datasets = Path(str(resources.files("posbench") / "datasets"))  # installed unzipped: a real folder
    if not (datasets / name).is_dir():
        shipped = ", ".join(sorted(d.name for d in datasets.iterdir() if d.is_dir()))
        raise PosbenchError(f"data.shipped={name} is not shipped with posbench; shipped: {shipped}")
    return datasets / name


def _local_split_file(folder: Path, split: str) -> Path:
    for name in (f"{split}.txt", f"wiki.{split}.tokens"):
        if (folder / name).is_file():
            return folder / name
    raise PosbenchError(f"data folder {folder} has no {split} split (expected {split}.txt or wiki.{split}.tokens)")


def _read_lines(file: Path) -> list[str]:
    try:  # decoded whole, so that the error's offset is the file's
        return file.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PosbenchError(
            f"{file} is not UTF-8 text (byte {e.start} is 0x{e.object[e.start]:02x}); convert it to UTF-8, "
            f"e.g. iconv -f latin1 -t utf-8"
        ) from None


def _read_local(folder: Path) -> dict[str, list[str]]:
    if folder.is_file():
        raise PosbenchError(f"data folder {folder} is a file, not a folder (data.path); pass the folder holding it")
    if not folder.is_dir():
        raise PosbenchError(f"data folder {folder} does not exist (data.path)")
    lines = {}
    for split in SPLITS:
        file = _local_split_file(folder, split)
        lines[split] = _read_lines(file)
        if not any(line.strip() for line in lines[split]):  # <eos> alone: no window to train or score
            raise PosbenchError(
                f"the {split} split in {folder} is empty: {file.name} holds no words (every split needs some)"
            )
    return lines


def local_folder(cfg: DataConfig) -> Optional[Path]:
    """The folder to read: ``data.path``, else the shipped ``data.shipped``; None for the hub."""
    if cfg.path:
        return Path(cfg.path).expanduser()
    return shipped_folder(cfg.shipped) if cfg.shipped else None


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check, so that an offline machine fails at once instead of after minutes of retries."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _read_hub(cfg: DataConfig) -> dict[str, list[str]]:
    offline_hint = (
        "offline? pass data=wikitext2_mini (the WikiText-2 slice shipped with posbench) "
        "or data.path=DIR, a folder with train.txt/valid.txt/test.txt"
    )
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
    folder = local_folder(cfg)
    corpus = build_corpus(_read_local(folder) if folder else _read_hub(cfg))
    log.info(
        "data: %s, vocab %d, tokens %s",
        folder or f"{cfg.hf_path}/{cfg.hf_name}",
        corpus.vocab_size,
        {s: len(t) for s, t in corpus.splits.items()},
    )
    return corpus
