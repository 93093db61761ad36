import pytest
import torch

from posbench import data
from posbench.data import EOS, UNK, DataConfig, build_corpus, load_corpus, tokenize
from posbench.errors import PosbenchError


def test_tokenize_splits_on_whitespace_and_ends_every_line():
    assert tokenize([" = Title = ", "", "a  b\tc"]) == ["=", "Title", "=", EOS, EOS, "a", "b", "c", EOS]


def test_vocabulary_comes_from_train_and_unseen_words_map_to_unk():
    corpus = build_corpus({"train": ["a b", "b c"], "valid": ["c d"], "test": ["a"]})
    assert corpus.vocab == ["a", "b", EOS, "c", UNK]
    assert corpus.splits["train"].tolist() == [0, 1, 2, 1, 3, 2]
    assert corpus.splits["valid"].tolist() == [3, 4, 2]
    assert corpus.splits["test"].dtype == torch.long


@pytest.mark.parametrize("names", [("train.txt", "valid.txt", "test.txt"), ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")])
def test_local_folder_in_either_naming(tmp_path, names):
    for name, text in zip(names, ["x y\nz\n", "y\n", "x\n"]):
        (tmp_path / name).write_text(text)
    corpus = load_corpus(DataConfig(path=str(tmp_path)))
    assert corpus.splits["train"].tolist() == [0, 1, 2, 3, 2]  # x y <eos> z <eos>
    assert len(corpus.splits["valid"]) == 2


def test_wikitext_slice_statistics(mini_data):
    corpus = load_corpus(DataConfig(path=str(mini_data)))
    train_words = sum(len(line.split()) + 1 for line in (mini_data / "train.txt").read_text().splitlines())
    assert len(corpus.splits["train"]) == train_words
    assert corpus.vocab[corpus.splits["train"][0]] == EOS  # the file opens with an empty line


def test_missing_folder_and_missing_split(tmp_path):
    with pytest.raises(PosbenchError, match="does not exist"):
        load_corpus(DataConfig(path=str(tmp_path / "nope")))
    (tmp_path / "train.txt").write_text("a\n")
    with pytest.raises(PosbenchError, match="no valid split"):
        load_corpus(DataConfig(path=str(tmp_path)))


def test_empty_train_split(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text("\n" if split == "train" else "a\n")
    with pytest.raises(PosbenchError, match="empty"):
        load_corpus(DataConfig(path=str(tmp_path)))


def test_offline_hub_fails_at_once_with_the_way_out(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(data, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(PosbenchError, match="data.path=DIR") as info:
        load_corpus(DataConfig())
    assert "\n" not in str(info.value)
