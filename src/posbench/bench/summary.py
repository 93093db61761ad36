"""bench.md: the tables of bench.csv for a reader, training, evaluation and decoding."""

from __future__ import annotations

import pandas as pd
import torch

from ..markdown import markdown_table
from .decoding import DECODE_STEPS


def peaks_text(peaks: dict[str, float]) -> str:
    return ", ".join(f"{precision} {flops / 1e9:.1f} GFLOP/s" for precision, flops in peaks.items())


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
