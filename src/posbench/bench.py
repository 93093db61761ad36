"""``posbench bench``: training and evaluation speed and memory of every encoding × attention backend.

Random tokens, so it needs no data. Every figure is the median of a few repeats after a
warm-up (which also pays for compilation), with its ratio to the ``eager`` backend measured
in the same process, in each precision (``precisions``), and its fraction of the matmul peak
measured in that precision. Writes ``bench.csv`` and ``bench.md`` into the run folder.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pandas as pd
import torch
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from .config import TrainConfig
from .errors import Problems
from .evaluate import score_nonoverlapping
from .io import write_csv
from .markdown import markdown_table
from .model import LanguageModel, ModelConfig, build_problems
from .optim import make_optimizer
from .positional import ENCODINGS
from .runtime import autocast, check_precision, freed_memory_kept, resolve_device, resolve_precision

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


def check_bench(cfg) -> None:
    """Every number and name bench takes, checked before anything is measured; all problems at once."""
    problems = Problems()
    problems.add(f"{key} must be a positive integer, got {cfg[key]}" for key in POSITIVE if cfg[key] < 1)
    problems.add(f"{key} must be 0 or more, got {cfg[key]}" for key in ("train_steps", "warmup") if cfg[key] < 0)
    for key in ("encodings", "backends", "precisions"):
        problems.add(bench_list_problems(key, cfg[key]))
    if cfg.eval_lens or not cfg.train_steps:  # eval_lens=[] times training alone
        problems.add(bench_list_problems("eval_lens", cfg.eval_lens))
    if any(n < 1 for n in cfg.eval_lens):
        problems.add([f"eval_lens must hold positive integers, got {list(cfg.eval_lens)}"])
    unknown = [e for e in cfg.encodings or () if e not in ENCODINGS]
    if unknown:
        problems.add([f"encodings: unknown {unknown}; choices: {', '.join(ENCODINGS)}"])
    problems.run(resolve_device, cfg.device)
    for precision in cfg.precisions:
        problems.run(check_precision, precision)
    models = [ModelConfig(**{**OmegaConf.to_container(cfg.model), "attention": backend}) for backend in cfg.backends]
    encodings = [ENCODINGS[name][0]() for name in cfg.encodings or ENCODINGS if name in ENCODINGS]
    built = [build_problems(model, encoding, cfg.train_len) for model in models for encoding in encodings]
    problems.add(dict.fromkeys(p for found in built for p in found))  # a model's problem once, not once per pair
    problems.raise_any()


#: The numbers of bench that must be at least 1.
POSITIVE = ("vocab_size", "train_batch", "train_len", "eval_repeats")


def bench_list_problems(key: str, values) -> list[str]:
    """A list of what to measure names something, each once: ``[]`` would measure nothing (or, for encodings,
    everything, as ``null`` does) and a repeat would measure the same thing twice."""
    if values is None:  # encodings=null: every encoding
        return []
    values = list(values)
    if not values:
        every = "; encodings=null measures every encoding" if key == "encodings" else ""
        alone = " (with train_steps=0 nothing is trained either)" if key == "eval_lens" else ""
        return [f"{key}=[] names nothing to measure{alone}{every}"]
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        return [f"{key} names {', '.join(repeated)} more than once, got {values}"]
    return []


def register_bench_config() -> None:
    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


class PeakRSS:
    """Highest resident memory of this process while the block runs, sampled every 2 ms (Linux)."""

    def __enter__(self):
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def median_seconds(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_peak_flops(device: torch.device, precision: str = "fp32", n: int = 2048, repeats: int = 5) -> float:
    """Measured FLOP/s of an n×n matmul in ``precision``: the yardstick for ``peak_fraction``."""
    a, b = (torch.randn(n, n, device=device, dtype=DTYPES[precision]) for _ in range(2))
    return 2 * n**3 / median_seconds(lambda: synced(lambda: a @ b, device), repeats, warmup=2)


def synced(fn, device: torch.device):
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out


def flops_per_token(m: ModelConfig, vocab_size: int, seq_len: int, training: bool) -> float:
    """Matmul FLOPs per token: 2 per weight (tied head counted once), plus causal attention.

    Attention: q·kᵀ and p·v over on average T/2 keys, 2·(T/2)·d each per layer. Training is
    three times the forward pass (backward computes two products per forward product).
    """
    weights = m.n_layers * (4 * m.d_model**2 + 2 * m.d_model * m.d_ff) + m.d_model * vocab_size
    forward = 2 * weights + m.n_layers * 2 * seq_len * m.d_model
    return forward * (3 if training else 1)


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


def peaks_text(peaks: dict[str, float]) -> str:
    return ", ".join(f"{precision} {flops / 1e9:.1f} GFLOP/s" for precision, flops in peaks.items())


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


def measured(row: dict, tok_s: float, flops: float, peak: float, extra_mb: float) -> dict:
    """A bench row of a measurement: throughput, FLOP rate and its share of the matmul peak, memory."""
    return dict(
        row,
        tokens_per_s=tok_s,
        gflop_per_token=flops / 1e9,
        gflop_per_s=tok_s * flops / 1e9,
        peak_fraction=tok_s * flops / peak,
        peak_mem_mb=extra_mb,
        status="ok",
        reason="",
    )


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


#: Decoding rows: contexts of train_len times these, batch 1, the last tokens of each timed: up to this many
#: through the cache (each a few milliseconds), and up to this many without it (each a pass over the context).
DECODE_RATIOS = (1, 4, 16)
DECODE_STEPS = {"decode": 32, "decode_nocache": 2}


def decode_steps(phase: str, length: int) -> int:
    """Timed tokens at the end of a context of ``length``: at most half of it, so a cache holds some first."""
    return min(DECODE_STEPS[phase], length // 2)


def time_decoding(model: LanguageModel, cfg: BenchConfig, device, name: str, backend: str, peak: float) -> list[dict]:
    """Tokens/s of decoding at train_len x DECODE_RATIOS: ``decode`` through the key/value cache (``cache.py``),
    ``decode_nocache`` with a full pass over the sequence so far per token. FLOPs per token: one token's
    forward against the context with the cache, the whole context's without."""
    rows, gen = [], torch.Generator().manual_seed(cfg.seed)
    for length in (cfg.train_len * ratio for ratio in DECODE_RATIOS):
        base = dict(encoding=name, backend=backend, seq_len=length, batch=1)
        unsupported = model.encoding.unsupported_reason(length)
        if unsupported or length < 4:  # a cache of one token at least, a warm-up step, the timed ones
            status = "unsupported" if unsupported else "skipped"
            reason = unsupported or f"a context of {length} tokens is too short to time decoding steps in"
            rows += [dict(base, phase=phase, status=status, reason=reason) for phase in DECODE_STEPS]
            continue
        tokens = torch.randint(0, cfg.vocab_size, (1, length), generator=gen).to(device)
        speeds = {}
        for phase, cached in (("decode", True), ("decode_nocache", False)):
            flops = flops_per_token(cfg.model, cfg.vocab_size, length, training=False) * (1 if cached else length)
            steps = decode_steps(phase, length)
            with PeakRSS() as mem:
                runs = [decoding_seconds(model, tokens, steps, cached, device) for _ in range(cfg.eval_repeats)]
            speeds[phase] = steps / statistics.median(runs)
            rows.append(measured(dict(base, phase=phase), speeds[phase], flops, peak, mem.extra_mb))
        log.info(
            "decode %s/%s at %d: %.0f tok/s with the cache, %.0f without (x%.1f)",
            *(name, backend, length, speeds["decode"], speeds["decode_nocache"]),
            speeds["decode"] / speeds["decode_nocache"],
        )
    return rows


@torch.no_grad()
def decoding_seconds(model: LanguageModel, tokens: torch.Tensor, steps: int, cached: bool, device) -> float:
    """Seconds to run the last ``steps`` of ``tokens`` (1, L) a token at a time, each one's logits computed: after
    the rest fills a cache (untimed, with one step of warm-up), or each as a pass over every token so far."""
    model.eval()
    start = tokens.shape[1] - steps
    cache = model.new_cache(tokens.shape[1]) if cached else None

    def step(t: int):
        with autocast(device, model.precision):
            hidden = model(tokens[:, t : t + 1], cache=cache) if cached else model(tokens[:, : t + 1])
            return model.head(hidden[:, -1])

    if cached:
        with autocast(device, model.precision):
            model(tokens[:, : start - 1], cache=cache)
    synced(lambda: step(start - 1), device)  # warm-up
    t0 = time.perf_counter()
    for t in range(start, tokens.shape[1]):
        step(t)
    synced(lambda: None, device)
    return time.perf_counter() - t0


def add_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """``vs_eager``: tokens/s over the eager backend's for the same encoding, phase and length."""
    key = ["encoding", "phase", "seq_len", "precision", "compile"]
    eager = table[table.backend == "eager"].set_index(key).tokens_per_s
    baseline = table.set_index(key).index.map(lambda k: eager.get(k, float("nan")))
    return table.assign(vs_eager=table.tokens_per_s.to_numpy() / baseline.to_numpy())


def markdown(table: pd.DataFrame, cfg, device, peaks: dict[str, float]) -> str:
    m = cfg.model
    measured = (
        [f"{cfg.train_steps} training steps (batch {cfg.train_batch} × {cfg.train_len})"] if cfg.train_steps else []
    )
    measured += [f"{cfg.eval_repeats} evaluations (batch 1)"] if cfg.eval_lens else []
    head = (
        f"Model: {m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads, FFN {m.d_ff}, "
        f"vocabulary {cfg.vocab_size:,}; device {device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; "
        f"measured matmul peak {peaks_text(peaks)}. Medians of {' and '.join(measured) or 'nothing'}, "
        f"each after {cfg.warmup} warm-up run(s).\n"
    )
    fmt = lambda v, spec: "" if pd.isna(v) else format(v, spec)  # noqa: E731
    train_rows = [
        [
            r.encoding,
            f"{r.backend}, compiled" if r.compile else r.backend,
            r.precision,
            fmt(r.tokens_per_s, ",.0f"),
            fmt(r.vs_eager, ".2f"),
            fmt(r.gflop_per_s, ".1f"),
            fmt(100 * r.peak_fraction, ".0f"),
            r.reason,
        ]
        for r in table[table.phase == "train"].itertuples()
    ]
    eval_rows = [
        [
            r.encoding,
            r.backend,
            r.precision,
            f"{r.seq_len:,}",
            fmt(r.tokens_per_s, ",.0f"),
            fmt(r.vs_eager, ".2f"),
            fmt(r.peak_mem_mb, ",.0f"),
            r.reason,
        ]
        for r in table[table.phase == "eval"].itertuples()
    ]
    numbers = {"train tok/s", "eval tok/s", "tokens", "× eager", "GFLOP/s", "% of peak", "extra memory MB"}
    train_header = ["encoding", "backend", "precision", "train tok/s", "× eager", "GFLOP/s", "% of peak", "note"]
    train = markdown_table(train_header, train_rows, right=numbers)
    eval_header = ["encoding", "backend", "precision", "tokens", "eval tok/s", "× eager", "extra memory MB", "note"]
    evals = markdown_table(eval_header, eval_rows, right=numbers)
    train_part = ["## Training", "", train, ""] if cfg.train_steps else []
    return "\n".join([head, *train_part, "## Evaluation", "", evals, "", *decoding_markdown(table)])


def decoding_markdown(table: pd.DataFrame) -> list[str]:
    """The decoding section of bench.md: tokens/s with and without the cache side by side."""
    decode = table[table.phase.isin(["decode", "decode_nocache"])]
    if decode.empty:
        return []
    fmt = lambda v, spec: "" if v is None or pd.isna(v) else format(v, spec)  # noqa: E731
    rows = []
    for key, group in decode.groupby(["encoding", "backend", "precision", "seq_len"], sort=False):
        speed = dict(zip(group.phase, group.tokens_per_s))
        cached, uncached = speed.get("decode"), speed.get("decode_nocache")
        ratio = cached / uncached if cached and uncached else None
        speeds = [fmt(v, ",.0f" if v is not None and v >= 10 else ".2g") for v in (cached, uncached)]
        cells = [*speeds, fmt(ratio, ".1f"), group.reason.iloc[0]]
        rows.append([*key[:3], f"{key[3]:,}", *cells])
    header = ["encoding", "backend", "precision", "context", "cached tok/s", "uncached tok/s", "× faster", "note"]
    timed = ", ".join(f"{phase} {steps}" for phase, steps in DECODE_STEPS.items())
    intro = f"Tokens at the end of each context, a token at a time (batch 1; timed tokens at most: {timed})."
    return ["## Decoding", "", intro, "", markdown_table(header, rows, right=set(header[3:7])), ""]
