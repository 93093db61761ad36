"""Running the probes named in ``probes=[...]`` on a trained model, their rows merged into the run's CSVs.

Each CSV starts with the run's identity columns (encoding, variant, train_len, seed) and ends with the
model's state; rows are merged as every result row is (``runfolder.merge_rows``), a probe's as it finishes.
The window probe writes results.csv rows of variant ``windowW`` (and per_position.csv), a length at a time.
Training's finish, resumed after a kill, keeps what its earlier attempt measured (``keep_measured``): a probe
whose last CSV (``FINISHED_BY``) holds rows of these weights, the window probe's measured lengths and the copy
probe's measured distances (both merged as they are measured: their long lengths take hours).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from ..copyseq import copy_symbols
from ..costs import check_copy_probe
from ..data import Corpus
from ..errors import PosbenchError
from ..evaluate import evaluate_lengths, variant_of
from ..runfolder import (
    ATTENTION_CSV,
    BIAS_CSV,
    CONTEXT_CSV,
    COPY_CSV,
    PROBE_IDENTITY,
    ModelState,
    measured_rows,
    merge_rows,
)
from ..variant import AttentionVariant
from .attention import attention_stats, bias_curves
from .config import probe_config
from .context import context_usage, default_contexts
from .copy import copy_probe, default_distances

log = logging.getLogger(__name__)

#: What a probe returns: rows by the CSV they go to, merged in this order.
Tables = dict[str, pd.DataFrame]
#: The CSV a probe merges last: its rows of a model say that the probe finished on it.
FINISHED_BY = {"context": CONTEXT_CSV, "attention": ATTENTION_CSV}


def probe_tokens(corpus: Corpus, cfg: DictConfig):
    """The test split the probes read (its first ``eval.max_tokens`` tokens when that is set)."""
    return corpus.splits["test"][: cfg.eval.max_tokens]


def check_probe_data(corpus: Corpus, cfg: DictConfig, device) -> None:
    """The options of ``cfg.probes`` whose bounds depend on the data, checked once it is loaded: ``train``
    calls this before its first step, so that a probe cannot fail only after training."""
    n_tokens, probe = len(probe_tokens(corpus, cfg)), probe_config(cfg.probe)
    split = f"the test split has {n_tokens} tokens" + (
        f" (eval.max_tokens={cfg.eval.max_tokens})" if cfg.eval.max_tokens is not None else ""
    )
    if "context" in cfg.probes:
        contexts = probe.contexts or default_contexts(cfg.train_len)
        if min(contexts) > n_tokens // 2:
            raise PosbenchError(f"probe.contexts={contexts}: {split}, too few (context k needs 2k tokens); lower them")
    if "copy" in cfg.probes:
        distances = [d for d in probe.distances or default_distances(cfg.train_len) if d <= n_tokens]
        if not distances:
            raise PosbenchError(f"probe.distances={list(probe.distances)}: {split}, fewer than any distance")
        check_copy_probe(cfg, corpus.vocab_size, distances, device)
        copy_symbols(corpus.splits["train"], corpus.vocab_size, probe.vocab, "probe.vocab")
    if "attention" in cfg.probes and cfg.train_len > n_tokens:
        raise PosbenchError(f"probes=[attention] reads train_len={cfg.train_len} tokens at least: {split}")


# Each probe: (model, corpus, cfg, device, out_dir, state, keep_measured) -> Tables.
def context(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path, state: ModelState, keep_measured) -> Tables:
    tokens, probe = probe_tokens(corpus, cfg), probe_config(cfg.probe)
    return {CONTEXT_CSV: context_usage(model, tokens, cfg.train_len, probe, cfg.eval.batch_tokens)}


def window(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path, state: ModelState, keep_measured) -> Tables:
    """Every eval length again with attention limited to W = ``eval.window`` (default train_len) keys; its rows
    are merged into results.csv a length at a time, as ``evaluate_lengths`` measures them."""
    windowed = OmegaConf.merge(cfg, {"eval": {"window": cfg.eval.window or cfg.train_len}})
    evaluate_lengths(model, corpus, windowed, device, out_dir, state, keep_measured=keep_measured)
    return {}


def copy(model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path, state: ModelState, keep_measured) -> Tables:
    """Each distance's row merged into copy_probe.csv as it is measured; with ``keep_measured``, the distances
    already there (measured on these weights, in this variant, with these words) are not measured again."""
    tokens, probe, identity = probe_tokens(corpus, cfg), probe_config(cfg.probe), probe_identity(cfg)
    symbols = copy_symbols(corpus.splits["train"], corpus.vocab_size, probe.vocab, "probe.vocab")
    kept = measured_rows(out_dir, COPY_CSV, state) if keep_measured else pd.DataFrame()
    if len(kept):
        words = kept.reindex(columns=["vocab"])["vocab"].astype("string").fillna("")  # a file older than vocab: ""
        kept = kept[(kept["variant"].fillna("") == identity["variant"]) & (words == str(probe.vocab or ""))]
    measured = set(kept["distance"]) if len(kept) else set()
    if measured:
        log.info(
            "probe copy: distances %s kept, measured on these weights before the run was interrupted", sorted(measured)
        )

    def merge(row: pd.DataFrame) -> None:
        merge_tables(out_dir, {COPY_CSV: row}, identity, state)

    copy_probe(model, tokens, symbols, cfg.train_len, probe, cfg.eval.batch_tokens, None, measured, merge)
    return {}


def attention(
    model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path, state: ModelState, keep_measured
) -> Tables:
    stats = attention_stats(model, probe_tokens(corpus, cfg), cfg.train_len)
    return {BIAS_CSV: bias_curves(model.encoding, cfg.train_len, device), ATTENTION_CSV: stats}  # FINISHED_BY last


PROBE_RUNNERS = {"context": context, "window": window, "copy": copy, "attention": attention}


def run_probes(
    model, corpus: Corpus, cfg: DictConfig, device, out_dir: Path, state: ModelState, keep_measured: bool = False
) -> None:
    """Run ``cfg.probes`` on ``model`` (in ``state``) and merge their rows into ``out_dir`` (whose lock the
    caller holds); with ``keep_measured`` (training's finish alone), not what an interrupted attempt to
    finish the same run already measured.

    The probes see the model as ``evaluate_lengths`` does, in the evaluation-time variant of ``eval.*``
    (the window probe sets its own window), and their rows are labelled with that variant."""
    identity = probe_identity(cfg)
    for name in cfg.probes:
        if keep_measured and finished(Path(out_dir), FINISHED_BY.get(name), state, identity["variant"]):
            log.info("probe %s: kept, measured on these weights before the run was interrupted", name)
            continue
        log.info("probe %s", name)
        with model.attention.evaluated_as(AttentionVariant.of(cfg.eval, cfg.model)):
            tables = PROBE_RUNNERS[name](model, corpus, cfg, device, Path(out_dir), state, keep_measured)
        merge_tables(Path(out_dir), tables, identity, state)


def probe_identity(cfg: DictConfig) -> dict:
    """The identity columns of the run's probe rows (PROBE_IDENTITY), labelled with the evaluation-time variant."""
    variant = variant_of(cfg.encoding, cfg.eval, cfg.model)
    return dict(encoding=cfg.encoding.name, variant=variant, train_len=cfg.train_len, seed=cfg.seed)


def merge_tables(out_dir: Path, tables: Tables, identity: dict, state: ModelState) -> None:
    """A probe's rows, each table after the run's ``identity`` columns, merged into its CSV in ``out_dir``."""
    for csv, rows in tables.items():
        rows = pd.concat([pd.DataFrame([identity] * len(rows), columns=PROBE_IDENTITY), rows], axis=1)
        if len(rows):
            merge_rows(Path(out_dir), csv, rows, state)
            log.info("%d rows written to %s", len(rows), Path(out_dir) / csv)


def finished(out_dir: Path, csv: str | None, state: ModelState, variant: str) -> bool:
    """Whether ``csv`` (a probe's ``FINISHED_BY``) holds rows of ``variant`` measured on ``state``'s weights once
    training had ended."""
    rows = measured_rows(out_dir, csv, state) if csv else pd.DataFrame()
    return bool(len(rows)) and bool((rows["variant"].fillna("") == variant).any())
