"""``posbench bench``: training and evaluation speed and memory of every encoding × attention backend.

Random tokens, so it needs no data. Every figure is the median of a few repeats after a
warm-up (which also pays for compilation), with its ratio to the ``eager`` backend measured
in the same process, in each precision (``precisions``), and its fraction of the matmul peak
measured in that precision. Writes ``bench.csv`` and ``bench.md`` into the run folder.

This module times training and evaluation; :mod:`.decoding` times decoding, :mod:`.timing` holds how a
measurement is taken, :mod:`.summary` writes bench.md. The command is ``commands/bench.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from ..attention import computes_terms
from ..config import TrainConfig
from ..evaluate import score_nonoverlapping
from ..io import write_csv
from ..model import LanguageModel, ModelConfig
from ..optim import make_optimizer
from ..positional import ENCODINGS
from ..runtime import autocast, freed_memory_kept, resolve_device, resolve_precision
from .decoding import time_decoding
from .summary import markdown, peaks_text
from .timing import PeakRSS, flops_per_token, matmul_peak_flops, measured, median_seconds, synced

log = logging.getLogger(__name__)

COLUMNS = [
    "encoding",
    "backend",
    "phase",
    "seq_len",
    "batch",
    "tokens_per_s",
    "vs_eager",
    "gflop_per_token",
    "gflop_per_s",
    "peak_fraction",
    "peak_mem_mb",
    "status",
    "reason",
    "precision",
    "compile",
]


@dataclass
class BenchConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    #: Encodings to measure (``null``: every one in ``posbench.positional.ENCODINGS``).
    encodings: Optional[List[str]] = None
    #: ``auto`` may be added: it runs what the rule in attention.py picks (sdpa, eager or flex).
    backends: List[str] = field(default_factory=lambda: ["eager", "sdpa", "flex"])
    #: The full WikiText-2 vocabulary.
    vocab_size: int = 33278
    train_batch: int = 16
    train_len: int = 256
    #: Timed training steps (forward + backward + AdamW) after ``warmup`` untimed ones (0: no training).
    train_steps: int = 3
    #: Untimed runs before each measurement (they also pay for compilation).
    warmup: int = 1
    #: Evaluation lengths, each one window of batch 1 through ``score_nonoverlapping``.
    eval_lens: List[int] = field(default_factory=lambda: [1024, 4096, 16384])
    eval_repeats: int = 2
    #: ``fp32``, ``bf16`` or ``auto`` (what ``train`` picks on this device); every row is measured in each.
    precisions: List[str] = field(default_factory=lambda: ["auto"])
    #: Also time training with ``model.compile=true`` (rows with ``compile`` true).
    compile_train: bool = False
    #: Also time lucidrains' x-transformers (attn_flash=True, same sizes) when it is importable.
    xtransformers: bool = True
    #: ``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda``.
    device: str = "auto"
    seed: int = 0
    debug: bool = False


def train_step_fn(model, loss_fn, cfg: BenchConfig, device: torch.device):
    gen = torch.Generator().manual_seed(cfg.seed)
    x, y = (
        torch.randint(0, cfg.vocab_size, (cfg.train_batch, cfg.train_len), generator=gen).to(device) for _ in range(2)
    )
    optimizer = make_optimizer(model, TrainConfig())  # what `posbench train` steps with
    model.train()

    def step():
        loss = loss_fn(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synced(lambda: None, device)

    return step


def xtransformers_model(cfg: BenchConfig, encoding: str):
    """x-transformers' decoder with our sizes and dropout, rotary or ALiBi; ``None`` if not installed."""
    try:
        from x_transformers import Decoder, TransformerWrapper
    except ImportError:
        return None
    m = cfg.model
    positions = {"rope": dict(rotary_pos_emb=True), "alibi": dict(alibi_pos_bias=True, alibi_num_heads=m.n_heads)}[
        encoding
    ]
    return TransformerWrapper(
        num_tokens=cfg.vocab_size,
        max_seq_len=cfg.train_len,
        emb_dropout=m.dropout,
        tie_embedding=m.tie_weights,
        use_abs_pos_emb=False,
        attn_layers=Decoder(
            dim=m.d_model,
            depth=m.n_layers,
            heads=m.n_heads,
            ff_mult=m.d_ff / m.d_model,
            attn_flash=True,
            attn_dropout=m.dropout if m.attn_dropout is None else m.attn_dropout,
            ff_dropout=m.dropout,
            **positions,
        ),
    )


def bench(cfg, run_dir) -> pd.DataFrame:
    """Measure, write bench.csv and bench.md into ``run_dir``, return the table."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    precisions = list(dict.fromkeys(resolve_precision(p, device)[0] for p in cfg.precisions))
    peaks = {precision: matmul_peak_flops(device, precision) for precision in precisions}
    log.info(
        "device %s, torch %s, %d threads, matmul peak %s",
        *(device, torch.__version__, torch.get_num_threads(), peaks_text(peaks)),
    )
    rows = []
    for name in cfg.encodings or ENCODINGS:
        for backend in cfg.backends:
            for precision in precisions:
                rows += measure_model(cfg, device, name, backend, precision, peaks[precision])
        if cfg.xtransformers and cfg.train_steps and name in ("rope", "alibi"):
            rows += [row for p in precisions for row in measure_xtransformers(cfg, device, name, p, peaks[p])]
    table = add_ratios(pd.DataFrame(rows, columns=COLUMNS))
    write_csv(table, run_dir / "bench.csv")
    (run_dir / "bench.md").write_text(markdown(table, cfg, device, peaks))
    log.info("bench written to %s", run_dir)
    return table


def bench_model(cfg: BenchConfig, name: str, backend: str, precision: str, compiled: bool, device) -> LanguageModel:
    model_cfg = ModelConfig(**{**OmegaConf.to_container(cfg.model), "attention": backend, "compile": compiled})
    torch.manual_seed(cfg.seed)
    return LanguageModel(model_cfg, ENCODINGS[name][0](), cfg.vocab_size, cfg.train_len, precision).to(device)


def measure_model(cfg: BenchConfig, device, name: str, backend: str, precision: str, peak: float) -> list[dict]:
    """Training and evaluation rows of one encoding, backend and precision; with ``compile_train`` a compiled
    model's training row too."""
    extra = cfg.compile_train and cfg.train_steps and not cfg.model.compile
    compiled = [cfg.model.compile, *([True] if extra else [])]
    rows = []
    for compile_ in compiled:
        model = bench_model(cfg, name, backend, precision, compile_, device)
        if not computes_terms(model.encoding, backend):  # it would time eager under another name
            reason = f"{name} computes through its layers' content terms, which the {backend} backend cannot serve"
            row = dict(encoding=name, backend=backend, phase="train", seq_len=cfg.train_len, batch=cfg.train_batch)
            return [dict(row, status="skipped", reason=reason, precision=precision, compile=compile_)]
        if cfg.train_steps:
            loss_fn = lambda x, y, m=model: m.token_nll(x, y).mean()  # noqa: E731
            rows.append(dict(time_training(model, loss_fn, cfg, device, name, backend, peak), compile=compile_))
        if compile_ == cfg.model.compile:  # evaluation as configured; compile_train adds training rows only
            rows += [dict(row, compile=compile_) for row in time_evaluation(model, cfg, device, name, backend, peak)]
            rows += [dict(row, compile=compile_) for row in time_decoding(model, cfg, device, name, backend, peak)]
    return [dict(row, precision=precision) for row in rows]


def measure_xtransformers(cfg: BenchConfig, device, name: str, precision: str, peak: float) -> list[dict]:
    """x-transformers' training row in ``precision``; none when it is not installed."""
    model = xtransformers_model(cfg, name)
    if model is None:
        return []
    model = model.to(device)

    def loss_fn(x, y):
        with autocast(device, precision):
            logits = model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    row = time_training(model, loss_fn, cfg, device, name, "x-transformers", peak)
    return [dict(row, precision=precision, compile=False)]


def time_training(model, loss_fn, cfg: BenchConfig, device, name: str, backend: str, peak: float) -> dict:
    row = dict(encoding=name, backend=backend, phase="train", seq_len=cfg.train_len, batch=cfg.train_batch)
    obstacle = model.attention.flex_obstacle(device, True, model.attn_dropout) if backend == "flex" else None
    if obstacle:
        return dict(row, status="skipped", reason=obstacle)
    flops = flops_per_token(cfg.model, cfg.vocab_size, cfg.train_len, training=True)
    with PeakRSS() as mem, freed_memory_kept():  # as train's loop does
        seconds = median_seconds(train_step_fn(model, loss_fn, cfg, device), cfg.train_steps, cfg.warmup)
    tok_s = cfg.train_batch * cfg.train_len / seconds
    log.info("train %s/%s: %.0f tok/s (%.0f%% of peak)", name, backend, tok_s, 100 * tok_s * flops / peak)
    return measured(row, tok_s, flops, peak, mem.extra_mb)


def time_evaluation(model: LanguageModel, cfg: BenchConfig, device, name: str, backend: str, peak: float) -> list[dict]:
    """One window of each eval length, batch 1, through the same path as ``posbench train``'s evaluation."""
    rows = []
    gen = torch.Generator().manual_seed(cfg.seed)
    for length in cfg.eval_lens:
        row = dict(encoding=name, backend=backend, phase="eval", seq_len=length, batch=1)
        reason = model.encoding.unsupported_reason(length)
        if reason:
            rows.append(dict(row, status="unsupported", reason=reason))
            continue
        tokens = torch.randint(0, cfg.vocab_size, (length + 1,), generator=gen)
        flops = flops_per_token(cfg.model, cfg.vocab_size, length, training=False)
        with PeakRSS() as mem:
            seconds = median_seconds(
                lambda t=tokens, n=length: synced(lambda: score_nonoverlapping(model, t, n, n, device), device),
                cfg.eval_repeats,
                cfg.warmup,
            )
        tok_s = length / seconds
        log.info("eval %s/%s at %d: %.0f tok/s, +%.0f MB", name, backend, length, tok_s, mem.extra_mb)
        rows.append(measured(row, tok_s, flops, peak, mem.extra_mb))
    return rows


def add_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """``vs_eager``: tokens/s over the eager backend's for the same encoding, phase and length."""
    key = ["encoding", "phase", "seq_len", "precision", "compile"]
    eager = table[table.backend == "eager"].set_index(key).tokens_per_s
    baseline = table.set_index(key).index.map(lambda k: eager.get(k, float("nan")))
    return table.assign(vs_eager=table.tokens_per_s.to_numpy() / baseline.to_numpy())
