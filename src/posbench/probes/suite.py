"""Running the probes named in ``probes=[...]`` on a trained model, their rows merged into the run's CSVs.

Each CSV starts with the run's identity columns (encoding, variant, train_len, seed); a re-run
replaces the rows with the same keys (``CSV_KEYS``), as ``posbench eval`` does in results.csv.
The window probe writes results.csv rows of variant ``windowW`` (and per_position.csv).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ..data import Corpus
from ..evaluate import RESULT_KEYS, evaluate_lengths, merge_csv, variant_of
from .attention import attention_stats, bias_curves
from .config import probe_config
from .context import context_usage
from .copy import copy_probe

log = logging.getLogger(__name__)

CONTEXT_CSV = "context_usage.csv"
COPY_CSV = "copy_probe.csv"
ATTENTION_CSV = "attention_stats.csv"
BIAS_CSV = "bias_curves.csv"
RESULTS_CSV = "results.csv"
IDENTITY = ["encoding", "variant", "train_len", "seed"]
#: A probe row is identified, within its run, by these columns.
CSV_KEYS = {
    CONTEXT_CSV: ["variant", "split", "context", "subset"],
    COPY_CSV: ["variant", "distance"],
    ATTENTION_CSV: ["variant", "eval_len", "layer", "head"],
    BIAS_CSV: ["variant", "head", "distance"],
    RESULTS_CSV: RESULT_KEYS,
}


def probe_tokens(corpus: Corpus, cfg: DictConfig):
    """The test split the probes read (its first ``eval.max_tokens`` tokens when that is set)."""
    return corpus.splits["test"][: cfg.eval.max_tokens]


def context(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path) -> dict[str, pd.DataFrame]:
    tokens, probe = probe_tokens(corpus, cfg), probe_config(cfg.probe)
    return {CONTEXT_CSV: context_usage(model, tokens, cfg.train_len, probe, cfg.eval.batch_tokens)}


def window(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path) -> dict[str, pd.DataFrame]:
    """Every eval length again with attention limited to W = ``eval.window`` (default train_len) keys."""
    windowed = OmegaConf.merge(cfg, {"eval": {"window": cfg.eval.window or cfg.train_len}})
    return {RESULTS_CSV: evaluate_lengths(model, corpus, windowed, device, out_dir)}


def copy(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path) -> dict[str, pd.DataFrame]:
    tokens, probe = probe_tokens(corpus, cfg), probe_config(cfg.probe)
    return {COPY_CSV: copy_probe(model, tokens, corpus.vocab_size, cfg.train_len, probe, cfg.eval.batch_tokens)}


def attention(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path) -> dict[str, pd.DataFrame]:
    stats = attention_stats(model, probe_tokens(corpus, cfg), cfg.train_len)
    return {ATTENTION_CSV: stats, BIAS_CSV: bias_curves(model.encoding, cfg.train_len, device)}


PROBE_RUNNERS = {"context": context, "window": window, "copy": copy, "attention": attention}


def run_probes(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path) -> None:
    """Run ``cfg.probes`` on ``model`` and merge their rows into ``out_dir`` (whose lock the caller holds).

    The probes see the model as ``evaluate_lengths`` does, in the evaluation-time variant of ``eval.*``
    (the window probe sets its own window), and their rows are labelled with that variant."""
    e = cfg.eval
    identity = dict(
        encoding=cfg.encoding.name,
        variant=variant_of(cfg.encoding, e, cfg.model),
        train_len=cfg.train_len,
        seed=cfg.seed,
    )
    for name in cfg.probes:
        log.info("probe %s", name)
        with model.attention.evaluated_as(e.window, e.blockwise, e.attn_temperature, e.sink):
            tables = PROBE_RUNNERS[name](model, corpus, cfg, device, Path(out_dir))
        for csv, rows in tables.items():
            if csv != RESULTS_CSV:
                rows = pd.concat([pd.DataFrame([identity] * len(rows), columns=IDENTITY), rows], axis=1)
            if len(rows):
                merge_csv(rows, Path(out_dir) / csv, CSV_KEYS[csv])
                log.info("probe %s: %d rows written to %s", name, len(rows), Path(out_dir) / csv)
