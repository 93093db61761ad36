"""Shared fixtures: the WikiText-2 slice shipped with posbench, composed configs, the CLI in a subprocess,
a closed pipe, unwritable folders, the legends of saved figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import matplotlib.figure
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from posbench.checkpoint import CHECKPOINT, save_checkpoint
from posbench.commands import train as train_command
from posbench.config import CONFIG_DIR
from posbench.data import load_corpus, shipped_folder
from posbench.model import LanguageModel, ModelConfig
from posbench.positional import ENCODINGS

REPO = Path(__file__).resolve().parents[1]
MINI = shipped_folder("wikitext-2-mini")


@pytest.fixture
def mini_data() -> Path:
    """The WikiText-2 slice shipped with posbench (data=wikitext2_mini)."""
    return MINI


@pytest.fixture
def compose_config():
    """compose_config("train", ["encoding=rope", ...]) -> the composed DictConfig."""
    train_command.register()

    def _compose(config_name: str = "train", overrides: list[str] | None = None):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose(config_name, overrides=overrides or [])

    return _compose


def _posbench(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300, **kwargs):
    command = [sys.executable, "-m", "posbench", *args]
    environ = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        command, cwd=cwd or REPO, env=environ, capture_output=True, text=True, timeout=timeout, **kwargs
    )


@pytest.fixture
def saved_run(compose_config, mini_data):
    """saved_run(folder, encoding="rope"): an untrained smoke-sized model saved as a run would save it
    (no training: the numbers need not be good); returns ``folder``."""

    def _save(folder: Path, encoding: str = "rope") -> Path:
        cfg = compose_config("train", ["experiment=smoke", f"encoding={encoding}", f"data.path={mini_data}"])
        corpus = load_corpus(cfg.data)
        torch.manual_seed(0)
        model = LanguageModel(cfg.model, cfg.encoding, corpus.vocab_size, cfg.train_len)
        config = OmegaConf.to_container(cfg, resolve=True)
        save_checkpoint(folder / CHECKPOINT, {"model": model.state_dict(), "config": config, "vocab": corpus.vocab})
        return folder

    return _save


@pytest.fixture
def posbench():
    """posbench("train", "experiment=smoke", ...) -> the CompletedProcess of ``python -m posbench ...``."""
    return _posbench


def _assert_one_line(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posbench: error: "), done.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def assert_one_line():
    """assert_one_line(done, *fragments): exit code 2, no traceback, one ``posbench: error:`` line holding them."""
    return _assert_one_line


@pytest.fixture
def into_closed_pipe():
    """into_closed_pipe(command) -> its CompletedProcess, run with stdout a pipe whose reader has gone (as
    after ``| head`` has read its lines) and stderr captured."""

    def _run(command: list) -> subprocess.CompletedProcess:
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            return subprocess.run([str(c) for c in command], stdout=write_end, stderr=subprocess.PIPE, text=True)
        finally:
            os.close(write_end)

    return _run


@pytest.fixture
def read_only():
    """read_only(folder): make ``folder`` unwritable, for root too (chmod alone does not stop root)."""
    frozen: list[Path] = []

    def _freeze(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o555)
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", str(folder)], check=True)
        frozen.append(folder)
        return folder

    yield _freeze
    for folder in frozen:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)], check=False)
        folder.chmod(0o755)


#: The unit tests' model: the smoke preset's size, on sdpa (flex compiles a kernel per encoding).
TINY_MODEL = dict(name="tiny", n_layers=2, d_model=32, n_heads=4, d_ff=64, dropout=0.0, attention="sdpa")


@pytest.fixture
def tiny_lm():
    """tiny_lm("rope", vocab=50, train_len=16, encoding_noise=0.0, options=None, **model) -> a seeded tiny LM.

    ``encoding_noise``: the std of noise added to the parameters of the encoding and of its layer terms, so that
    a learned bias that starts at zero cannot hide a bug. ``options``: the encoding's config fields (dict).
    ``model`` overrides TINY_MODEL's fields.
    """

    def _tiny_lm(
        encoding: str, *, vocab: int = 50, train_len: int = 16, encoding_noise: float = 0.0, options=None, **model
    ) -> LanguageModel:
        torch.manual_seed(0)
        encoding_cfg = ENCODINGS[encoding][0](**(options or {}))
        lm = LanguageModel(ModelConfig(**{**TINY_MODEL, **model}), encoding_cfg, vocab, train_len)
        with torch.no_grad():
            for p in lm.encoding_parameters():  # the layers' content terms' too
                p.add_(encoding_noise * torch.randn_like(p))
        return lm

    return _tiny_lm


@pytest.fixture
def content_layer(monkeypatch):
    """content_layer("fox", T) -> (layer, plan): one float64 SelfAttention (4 heads of 8) of that encoding, every
    weight drawn N(0, 0.3²) (its layer terms' too), and the plan of a training pass over T tokens; at T > 64 the
    queries go in blocks of at most 50 (MASK_BUDGET lowered), so the reference tests reach the query blocks."""
    import posbench.attention as attention_mod
    from posbench.attention import Attention
    from posbench.model import SelfAttention
    from posbench.positional import build_encoding

    def _layer(name: str, seq_len: int):
        torch.manual_seed(0)
        encoding = build_encoding(ENCODINGS[name][0](), n_heads=4, head_dim=8, d_model=32, train_len=16)
        monkeypatch.setattr(attention_mod, "MASK_BUDGET", int(4 * 4 * seq_len * 50 * encoding.logit_memory_factor))
        layer = SelfAttention(ModelConfig(d_model=32, n_heads=4, dropout=0.0), Attention("auto", encoding)).double()
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_(0.0, 0.3)
        plan = layer.attention.plan(seq_len, torch.device("cpu"), True, 0.0)
        assert plan.backend == "eager" and (plan.query_block is not None) == (seq_len > 64)
        return layer, plan

    return _layer


@pytest.fixture
def figure_legends(monkeypatch) -> dict[str, list[str]]:
    """The legend entries of each figure the report saves, by file name (filled as it saves them)."""
    legends, savefig = {}, matplotlib.figure.Figure.savefig

    def recording_savefig(self, path, *args, **kwargs):
        texts = [
            t.get_text()
            for legend in self.legends + [ax.get_legend() for ax in self.axes]
            if legend
            for t in legend.get_texts()
        ]
        legends[Path(path).name] = texts
        return savefig(self, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording_savefig)
    return legends
