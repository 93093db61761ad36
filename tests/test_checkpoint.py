"""Checkpoints: plain payloads round-trip; anything missing, broken, foreign or pickled is refused in one line."""

from __future__ import annotations

import builtins
import errno
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from posbench import checkpoint
from posbench.checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint
from posbench.errors import PosbenchError

VOCAB = ["the", "cat", "<eos>", "<unk>"]


def payload(**changes) -> dict:
    plain = {
        "model": {"weight": torch.arange(6.0).reshape(2, 3)},
        "config": {"encoding": {"name": "alibi"}, "train_len": 32},
        "vocab": list(VOCAB),
        "step": 4,
        "valid_loss": 5.5,
    }
    return plain | changes


def test_round_trip_gives_the_weights_and_a_config_object(tmp_path):
    save_checkpoint(tmp_path / CHECKPOINT, payload())
    loaded = load_checkpoint(tmp_path)  # a folder means its checkpoint.pt
    assert torch.equal(loaded["model"]["weight"], torch.arange(6.0).reshape(2, 3))
    assert isinstance(loaded["config"], DictConfig) and loaded["config"].encoding.name == "alibi"
    assert loaded["vocab"] == VOCAB and loaded["step"] == 4
    assert load_checkpoint(tmp_path / CHECKPOINT, encoding="alibi", vocab=VOCAB)["valid_loss"] == 5.5


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
def test_a_full_disk_is_an_oserror_naming_the_checkpoint(tmp_path, monkeypatch):
    # torch's writer itself meets the full disk, as when last.pt outgrows the free space.
    monkeypatch.setattr(checkpoint, "open", lambda path, mode: builtins.open("/dev/full", mode), raising=False)
    with pytest.raises(OSError) as caught:
        save_checkpoint(tmp_path / "last.pt", payload(model={"weight": torch.zeros(1 << 16)}))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "last.pt")
    assert list(tmp_path.iterdir()) == []


def test_missing(tmp_path):
    with pytest.raises(PosbenchError, match=r"checkpoint .*nowhere.pt does not exist"):
        load_checkpoint(tmp_path / "nowhere.pt")


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.0])
def test_truncated(tmp_path, keep):
    path = tmp_path / CHECKPOINT
    save_checkpoint(path, payload())
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(PosbenchError, match=r"is unreadable \(truncated or not a checkpoint\)") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value)


def test_not_a_checkpoint_file(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("results, not weights\n")
    with pytest.raises(PosbenchError, match="is unreadable"):
        load_checkpoint(path)


def test_pickled_objects_are_refused(tmp_path):
    path = tmp_path / CHECKPOINT
    torch.save(payload(config=OmegaConf.create({"encoding": {"name": "alibi"}})), path)  # a pickled DictConfig
    with pytest.raises(PosbenchError, match="holds pickled Python objects.*refuses to load it") as e:
        load_checkpoint(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "bad", [{"weights": torch.zeros(2)}, [1, 2, 3], payload(config="encoding=alibi"), payload(vocab="the cat")]
)
def test_plain_but_not_a_posbench_checkpoint(tmp_path, bad):
    torch.save(bad, tmp_path / CHECKPOINT)
    with pytest.raises(PosbenchError, match="is not a posbench checkpoint"):
        load_checkpoint(tmp_path)


def test_another_encoding(tmp_path):
    save_checkpoint(tmp_path / CHECKPOINT, payload())
    with pytest.raises(PosbenchError, match="was trained with encoding=alibi, not encoding=rope"):
        load_checkpoint(tmp_path, encoding="rope")


@pytest.mark.parametrize(
    "data_vocab, where", [(["the", "dog", "<eos>", "<unk>"], 1), (VOCAB + ["dog"], 4), (VOCAB[:3], 3)]
)
def test_vocabulary_that_does_not_match_the_data(tmp_path, data_vocab, where):
    save_checkpoint(tmp_path / CHECKPOINT, payload())
    with pytest.raises(
        PosbenchError,
        match=rf"4 words that does not match the data's {len(data_vocab)} \(they first differ at word {where}\)",
    ):
        load_checkpoint(tmp_path, vocab=data_vocab)
