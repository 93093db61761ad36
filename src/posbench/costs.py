"""Bounds and estimates for the options whose cost grows without limit.

A value that cannot fit in the device's memory is refused before anything runs, in one line naming
its key; a value that fits but is costly gets one warning with an estimate, and the run goes on.

* ``encoding.randomized_positions=M``: every training step draws M random keys per sequence
  (``positional.base.sample_positions``), and ``encoding=learned`` holds a table of M positions.
* ``probe.span=S`` (with ``probe.trials`` and ``probe.distances``): the copy probe scores sequences of
  2 x S + d tokens and holds the logits of S - 1 of their positions over the whole vocabulary.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from .errors import PosbenchError

log = logging.getLogger(__name__)

#: Above this many bytes held at once, a knob gets a warning with its estimate.
COSTLY_BYTES = 2**30
#: Seconds per random key of ``sample_positions`` on a CPU (5e7 positions x 16 sequences: 1.7 s a step).
SECONDS_PER_KEY = 2e-9
#: FLOP/s of a CPU, roughly (``probe.span=20000``, the paper model: about 12 TFLOP a trial, 81 s).
CPU_FLOP_RATE = 1.5e11
#: Above this many seconds (estimated on a CPU), the copy probe gets a warning.
COSTLY_SECONDS = 600
#: fp32 weight, gradient and AdamW's two moments: the bytes a learned parameter takes in training.
TRAINED_BYTES_PER_PARAM = 16


def device_memory(device: torch.device) -> int:
    """Bytes of memory of ``device``: the GPU's, or the machine's RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gigabytes(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def randomized_positions_bytes(cfg) -> tuple[int, dict[str, int]]:
    """(sequences per step, {what: bytes}) that ``encoding.randomized_positions`` holds in training."""
    limit = cfg.encoding.randomized_positions
    shortest = min(cfg.train.lengths) if cfg.train.lengths is not None else cfg.train_len
    rows = cfg.train.batch_size * cfg.train_len // shortest  # sequences per step, most at the shortest length
    held = {"its draws": rows * limit * 4}  # fp32 keys (B, M); topk adds little
    if cfg.encoding.name == "learned" and cfg.encoding.get("max_positions") is None:
        held["its learned table"] = limit * cfg.model.d_model * TRAINED_BYTES_PER_PARAM
    return rows, held


def check_randomized_positions(cfg, device: torch.device) -> None:
    """``encoding.randomized_positions``: one step's draw (and learned's table) must fit in memory."""
    limit = cfg.encoding.randomized_positions
    if limit is None:
        return
    rows, held = randomized_positions_bytes(cfg)
    memory = device_memory(device)
    for what, size in held.items():
        if size > memory:
            raise PosbenchError(
                f"encoding.randomized_positions={limit} needs {gigabytes(size)} for {what} ({rows} sequences "
                f"x {limit:,} positions a step), more than the {gigabytes(memory)} of {device.type}; lower it"
            )


def warn_randomized_positions(cfg) -> None:
    """One warning with the cost of a step's draw when it is large."""
    limit = cfg.encoding.randomized_positions
    if limit is None:
        return
    rows, held = randomized_positions_bytes(cfg)
    if held["its draws"] > COSTLY_BYTES:
        log.warning(
            "encoding.randomized_positions=%d draws %d x %s random keys every training step: about %s, "
            "and about %.1f s a step on a CPU",
            *(limit, rows, f"{limit:,}", gigabytes(held["its draws"]), rows * limit * SECONDS_PER_KEY),
        )


def check_copy_probe(cfg, vocab_size: int, distances: list[int], device: torch.device) -> None:
    """``probe.span``: one sequence's logits must fit; a probe estimated to run long says so first."""
    from .bench import flops_per_token

    span, trials = cfg.probe.span, cfg.probe.trials
    longest = 2 * span + max(distances)
    per_batch = max(1, cfg.eval.batch_tokens // longest)
    logits = per_batch * (span - 1) * vocab_size * 4
    memory = device_memory(device)
    if logits > memory:
        raise PosbenchError(
            f"probe.span={span}: the copy probe's logits ({span - 1:,} positions x {vocab_size:,} words) need "
            f"{gigabytes(logits)}, more than the {gigabytes(memory)} of {device.type}; lower it"
        )
    lengths = [2 * span + d for d in distances]
    flops = sum(2 * trials * n * flops_per_token(cfg.model, vocab_size, n, training=False) for n in lengths)
    seconds = flops / CPU_FLOP_RATE
    if seconds > COSTLY_SECONDS or logits > COSTLY_BYTES:
        log.warning(
            "the copy probe (probe.span=%d, probe.trials=%d, %d distances up to %s) scores sequences of up to %s "
            "tokens: about %.0f TFLOP (%.1f h on a CPU) and %s of logits at once; lower probe.span, probe.trials "
            "or probe.distances",
            *(span, trials, len(distances), f"{max(distances):,}", f"{longest:,}", flops / 1e12, seconds / 3600),
            gigabytes(logits),
        )


@functools.cache
def corpus_vocab_size(data_yaml: str) -> int:
    """The vocabulary size of the data config ``data_yaml`` (its YAML), read once however many shapes use it."""
    from omegaconf import OmegaConf

    from .data import DataConfig, load_corpus

    return load_corpus(OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.create(data_yaml))).vocab_size


def timed_step_seconds(cfg) -> float:
    """Seconds of one training step of ``cfg``'s model on this machine, timed (after one warm-up step) on
    random tokens over the vocabulary of ``cfg.data`` (a task run's: its task's)."""
    import time

    from omegaconf import OmegaConf

    from .model import LanguageModel
    from .runtime import resolve_device, resolve_precision
    from .tasks import build_task

    device = resolve_device(cfg.device)
    vocab_size = build_task(cfg.task).vocab_size if cfg.task else corpus_vocab_size(OmegaConf.to_yaml(cfg.data))
    model = LanguageModel(
        cfg.model, cfg.encoding, vocab_size, cfg.train_len, resolve_precision(cfg.precision, device)[0]
    )
    model = model.to(device)
    x = torch.randint(vocab_size, (cfg.train.batch_size, cfg.train_len), device=device)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        model.token_nll(x, x).mean().backward()
        seconds.append(time.perf_counter() - start)
    return seconds[-1]


def announce_sweep(configs: list) -> None:
    """Before a sweep of ``train`` starts: its number of jobs and their time, from one timed step per model
    shape (training only; evaluation and probes add to it, ``train.patience`` may stop a job sooner)."""
    step_seconds: dict[str, float | None] = {}
    total, untimed = 0.0, 0
    for cfg in configs:
        shape = f"{cfg.model}|{cfg.encoding.name}|{cfg.train_len}|{cfg.train.batch_size}|{cfg.data}"
        if shape not in step_seconds:
            try:
                step_seconds[shape] = timed_step_seconds(cfg)
            except (PosbenchError, OSError):  # its data is missing, say: the job fails on its own, later
                step_seconds[shape] = None
        if step_seconds[shape] is None:
            untimed += 1
        else:
            total += step_seconds[shape] * cfg.train.steps
    log.warning(
        "sweep of %d job(s): about %s of training in all, one job after another on this machine%s "
        "(a timed step x train.steps; evaluation and probes add to it, train.patience may stop jobs sooner)",
        *(len(configs), duration(total), f", {untimed} job(s) not timed" if untimed else ""),
    )


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(seconds / 60, 0.1):.1f} min"
