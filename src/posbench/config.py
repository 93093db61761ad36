"""Structured configs: the dataclasses that validate every YAML file and override.

A misspelt key or a value of the wrong type fails when the config is composed,
before any data is read. ``check_config`` adds the rules a type cannot express, and reports every
problem they find at once (``errors.Problems``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from .costs import check_randomized_positions
from .data import DataConfig
from .errors import PosbenchError, Problems, raise_problems
from .lengths import eval_lens_of, lengths_problems, train_lengths_of, train_lengths_problems
from .logger import check_logger
from .model import ModelConfig, build_problems
from .positional import ENCODINGS
from .probes.config import ProbeConfig, probes_problems
from .runtime import check_precision, check_threads, resolve_device
from .tasks import build_task
from .variant import AttentionVariant

CONFIG_DIR = Path(__file__).resolve().parent / "conf"


@dataclass
class TrainConfig:
    steps: int = 10000
    batch_size: int = 16
    lr: float = 1e-3
    #: Cosine decay ends at lr * min_lr_ratio.
    min_lr_ratio: float = 0.1
    warmup_steps: int = 500
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    #: Validation loss every N steps (and at the last step); the best model is kept.
    eval_every: int = 500
    #: Cap on validation tokens per periodic check (``null``: the whole split).
    val_tokens: Optional[int] = None
    #: Also measure the validation loss at these lengths at every check, logged in train_log.csv as
    #: ``valid_loss_L`` (``null``: train_len alone, as ``valid_loss``), to watch extrapolation form during
    #: training; only train_len's loss picks the best checkpoint and counts for patience. Each length reads
    #: at least one window's tokens, ``train.val_tokens`` or not.
    val_lens: Optional[List[int]] = None
    log_every: int = 10
    #: Save the resume state (last.pt) every N steps, at the last step, and on SIGINT/SIGTERM.
    checkpoint_every: int = 100
    #: ``auto`` (continue from the run folder's last.pt if there is one; skip a finished run),
    #: ``true`` (last.pt must exist), ``false`` (start afresh), or the path of a last.pt to continue from.
    resume: str = "auto"
    #: train_log.csv flags a step whose loss exceeds this multiple of its running average...
    loss_spike_ratio: float = 1.5
    #: ...or whose gradient norm (before clipping) exceeds this multiple of its running average.
    grad_spike_ratio: float = 5.0
    #: This fraction of each batch's sequences are synthetic copy sequences (docs/probes.md; copyseq.py).
    copy_fraction: float = 0.0
    #: The first this many steps train on copy sequences alone (the warm-up); then ``copy_fraction`` applies.
    #: Its validations do not count toward ``patience``.
    copy_warmup_steps: int = 0
    #: The warm-up's span: ``null``, half the sequence repeated at once, so every copy sits half the length
    #: back and a model may learn that offset instead of copying; a number S, S tokens, 0 to length + 1 - 2S
    #: tokens of text, the span again, then text: the offsets vary, so only matching predicts the repeat
    #: (docs/tasks.md).
    copy_warmup_span: Optional[int] = None
    #: The warm-up's sequence length (``null``: as after it), with batch_size x train_len / length sequences
    #: per step, as ``lengths`` keeps tokens per step equal: shorter sequences, more copies per step.
    copy_warmup_len: Optional[int] = None
    #: Which targets of a copy sequence count in the loss: ``all``; ``repeat``: not the first span's (random
    #: tokens no model can predict, whose gradient is noise beside the copy's); ``copy``: the repeated span's
    #: alone, its tokens 2..S, the ones a copier predicts (docs/tasks.md). Text rows keep all of theirs.
    copy_loss: str = "all"
    #: Copy spans draw from this many of the training text's most frequent words (``null``: from every word,
    #: as the copy probe's do): a small vocabulary's words recur often enough to be matched (docs/tasks.md).
    copy_vocab: Optional[int] = None
    #: Mixed-length training (``null``: every step at train_len). Each step trains at one of these lengths
    #: L with batch_size x train_len / L sequences, so every step sees batch_size x train_len tokens; each
    #: L must divide that. train_len must be the longest of them (one rule, no guessing whether train_len
    #: was given): the model is built for it, validation runs at it, results.csv names it (and lists all
    #: of them in train_lengths, e.g. ``64|128|256``).
    lengths: Optional[List[int]] = None
    #: ``random``: each step's length drawn from (seed, step), the same again after a resume;
    #: ``curriculum``: shortest first, equal shares of the steps per length (Shortformer, arXiv:2012.15832).
    length_order: str = "random"
    #: Stop once this many validation checks in a row bring no new best validation loss (``null``: never);
    #: the best model is what is evaluated either way. A curriculum counts checks from its last stage
    #: (train_len) on: it is not stopped before it has trained at the length it is validated at.
    patience: Optional[int] = None


@dataclass
class EvalConfig:
    splits: List[str] = field(default_factory=lambda: ["valid", "test"])
    #: ``nonoverlapping``: windows of eval_len side by side (the ALiBi paper's protocol);
    #: ``sliding``: windows advancing by ``stride`` tokens, each target scored once (see evaluate.py).
    mode: str = "nonoverlapping"
    #: Tokens a sliding window advances by (capped at eval_len); required for ``sliding``.
    stride: Optional[int] = None
    #: per_position.csv: one row per window position below this...
    per_position_exact: int = 1024
    #: ...and one row per this many positions beyond (``position`` is the bucket's first).
    per_position_bucket: int = 64
    #: Tokens per forward pass; windows are batched up to this many.
    batch_tokens: int = 16384
    #: Score only the first N tokens of each split (``null``: all). For smoke tests.
    max_tokens: Optional[int] = None
    #: Attend to each query's last W keys only (``null``: all); rows get ``variant=windowW``.
    window: Optional[int] = None
    #: Blockwise causal attention, as xPos's paper evaluates (Sun et al., 2022): each query attends to the
    #: keys of its own block of W positions and of the previous block (``null``: all); ``variant=blockwiseW``.
    blockwise: Optional[int] = None
    #: With ``window`` or ``blockwise``: the sequence's first S keys stay visible to every query (attention
    #: sinks, Xiao et al., 2023, which a window evicts; 0: none); rows get ``variant=window256+sink4``.
    sink: int = 0
    #: Attention temperature tau (Wang et al., 2024): q·kᵀ/√d multiplied by tau, the encoding's bias left
    #: as it is (``null``: off; above 1 sharpens); rows get ``variant=temp1.2``.
    attn_temperature: Optional[float] = None


@dataclass
class Config:
    encoding: Any = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    #: Sequence length seen in training.
    train_len: int = 256
    #: Evaluation lengths; ``null`` means train_len x 1, 2, 4, 8, 16.
    eval_lens: Optional[List[int]] = None
    seed: int = 0
    #: ``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda``.
    device: str = "auto"
    #: ``auto`` (bf16 on CUDA and on CPUs with native bf16, else fp32), ``fp32`` or ``bf16`` (autocast; runtime.py).
    precision: str = "auto"
    #: Show full tracebacks instead of one-line errors.
    debug: bool = False
    #: ``csv`` (train_log.csv, results.csv) or ``tensorboard`` (event files in the run folder as well).
    logger: str = "csv"
    #: Torch CPU threads for this run (``null``: torch's default); set 1 when N jobs share N cores.
    threads: Optional[int] = None
    #: Probes run on the best model after evaluation: some of context, window, copy, attention (docs/probes.md).
    probes: List[str] = field(default_factory=list)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    #: A synthetic task to train on instead of text (``task=passkey|mqar|copy``; docs/tasks.md); ``null``: text.
    task: Any = None


def config_on_schema(saved) -> DictConfig:
    """A saved run's config (a dict or DictConfig) on today's schema: ``Config`` and its encoding's dataclass,
    so a key added since it was saved reads as its default. One line when it does not fit (an unknown
    encoding, a key this version no longer has, a value of the wrong type, an interpolation to nothing)."""
    saved = OmegaConf.create(saved)
    name = OmegaConf.select(saved, "encoding.name", throw_on_resolution_failure=False)
    if name not in ENCODINGS:
        raise PosbenchError(f"the checkpoint's encoding {name!r} is unknown; known: {', '.join(ENCODINGS)}")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), saved)
        cfg.encoding = OmegaConf.merge(OmegaConf.structured(ENCODINGS[name][0]), saved.encoding)
        OmegaConf.to_container(cfg, resolve=True)  # a hand-edited config may hold an interpolation to nothing
    except Exception as e:  # a checkpoint from an incompatible version of posbench
        raise PosbenchError(
            f"the checkpoint's config does not fit this version of posbench: {str(e).splitlines()[0]}"
        ) from None
    return cfg


EVAL_MODES = ("nonoverlapping", "sliding")
COPY_LOSSES = ("all", "repeat", "copy")


def eval_problems(e) -> list[str]:
    """The rules of ``eval.*``."""
    found = []
    if e.mode not in EVAL_MODES:
        found.append(f"eval.mode must be one of {', '.join(EVAL_MODES)}, got {e.mode!r}")
    if e.mode == "sliding" and (e.stride is None or e.stride < 1):
        found.append(f"eval.mode=sliding needs a positive eval.stride=S, got {e.stride}")
    if e.per_position_exact < 0 or e.per_position_bucket < 1:
        found.append("eval.per_position_exact must be >= 0 and eval.per_position_bucket >= 1")
    if e.batch_tokens < 1 or (e.max_tokens is not None and e.max_tokens < 2):
        found.append(
            f"eval.batch_tokens must be >= 1 and eval.max_tokens >= 2 or null, got {e.batch_tokens}, {e.max_tokens}"
        )
    found += AttentionVariant.of(e).problems()  # the variant's own rules
    unknown = set(e.splits) - {"train", "valid", "test"}
    if unknown or not e.splits:
        found.append(f"eval.splits must hold some of train, valid, test; got {list(e.splits)}")
    return found


def optimizer_problems(t) -> list[str]:
    """The schedule, weight decay, clipping and spike flags: a negative, zero, NaN or infinite value would
    train wrongly (a negative final lr climbs the loss) or fail once training starts, so it stops here."""
    rules = [
        ("lr", t.lr > 0, "a positive number"),
        ("min_lr_ratio", 0 <= t.min_lr_ratio <= 1, "in [0, 1]"),
        ("warmup_steps", t.warmup_steps >= 0, "a non-negative integer"),
        ("weight_decay", t.weight_decay >= 0, "a non-negative number"),
        ("grad_clip", t.grad_clip > 0, "a positive number"),
        ("loss_spike_ratio", t.loss_spike_ratio > 1, "a number above 1"),
        ("grad_spike_ratio", t.grad_spike_ratio > 1, "a number above 1"),
    ]
    bad = [(key, what) for key, ok, what in rules if not (ok and math.isfinite(t[key]))]
    return [f"train.{key} must be {what}, got {t[key]}" for key, what in bad]


def copy_warmup_problems(cfg) -> list[str]:
    """``train.copy_warmup_span`` and ``train.copy_warmup_len``: shapes of a warm-up that is given."""
    t, found = cfg.train, []
    given = [key for key in ("copy_warmup_span", "copy_warmup_len") if t[key] is not None]
    if given and not t.copy_warmup_steps:
        return [f"train.{given[0]} shapes the copy warm-up: set train.copy_warmup_steps too"]
    length = cfg.train_len if t.copy_warmup_len is None else t.copy_warmup_len
    tokens = t.batch_size * cfg.train_len
    if t.copy_warmup_len is not None and not (0 < length <= cfg.train_len and tokens % length == 0):
        found.append(
            f"train.copy_warmup_len must be positive, at most train_len={cfg.train_len}, and divide train.batch_size x "
            f"train_len = {tokens} (equal tokens per step), got {length}"
        )
    elif t.copy_warmup_span is not None and not 2 <= t.copy_warmup_span <= (length + 1) // 2:
        found.append(
            f"train.copy_warmup_span must be 2 to {(length + 1) // 2} tokens (the warm-up's sequences hold "
            f"{length + 1}: the span twice), got {t.copy_warmup_span}"
        )
    return found


def train_problems(cfg) -> list[str]:
    """The rules of ``train.*`` and ``seed``."""
    t = cfg.train
    found = [
        f"train.{key} must be a positive integer, got {t[key]}"
        for key in ("steps", "batch_size", "eval_every", "log_every", "checkpoint_every")
        if t[key] < 1
    ]
    if t.val_tokens is not None and t.val_tokens < 2:  # [:0] or [:-n] validates on the wrong tokens, [:1] on none
        found.append(f"train.val_tokens must be at least 2 (the first token is no target) or null, got {t.val_tokens}")
    if not 0 <= cfg.seed < 2**64:  # numpy's generators take no negative seed, torch none past 64 bits
        found.append(f"seed must be an integer in [0, 2**64), got {cfg.seed}")
    found += optimizer_problems(t)
    if t.patience is not None and t.patience < 1:
        found.append(f"train.patience must be a positive number of validation checks or null, got {t.patience}")
    if not 0 <= t.copy_fraction <= 1:
        found.append(f"train.copy_fraction must be in [0, 1], got {t.copy_fraction}")
    if t.copy_warmup_steps < 0:
        found.append(f"train.copy_warmup_steps must be a non-negative number of steps, got {t.copy_warmup_steps}")
    if t.copy_vocab is not None and t.copy_vocab < 2:
        found.append(f"train.copy_vocab must be at least 2 words or null, got {t.copy_vocab}")
    elif t.copy_vocab is not None and not (t.copy_fraction or t.copy_warmup_steps):
        found.append("train.copy_vocab draws copy spans: set train.copy_fraction or train.copy_warmup_steps too")
    if t.copy_loss not in COPY_LOSSES:
        found.append(f"train.copy_loss must be one of {', '.join(COPY_LOSSES)}, got {t.copy_loss!r}")
    found += copy_warmup_problems(cfg)
    found += train_lengths_problems(cfg)
    if t.val_lens is not None:
        found += lengths_problems("train.val_lens", list(t.val_lens))
    return found


def runtime_problems(problems: Problems, cfg) -> None:
    """Device, precision, threads and logger: what the machine must offer, checked before any data is read."""
    problems.run(resolve_device, cfg.device)
    problems.run(check_precision, cfg.precision)
    problems.run(check_threads, cfg.threads)
    problems.run(check_logger, cfg.logger)


def config_problems(cfg) -> list[str]:
    """Every problem of a train config that its schema's types cannot catch, each naming its key."""
    problems = Problems()
    problems.add(lengths_problems("train_len", [cfg.train_len]))
    if cfg.eval_lens is not None:  # null: multiples of train_len, right when train_len is
        problems.add(lengths_problems("eval_lens", list(cfg.eval_lens)))
    problems.add(train_problems(cfg))
    if not problems.found:  # a task's lengths are judged on lengths that are right
        problems.add(task_problems(cfg))
    problems.add(eval_problems(cfg.eval))
    problems.add(probes_problems(cfg.probes, cfg.probe))
    runtime_problems(problems, cfg)
    problems.add(build_problems(cfg.model, cfg.encoding, cfg.train_len))
    if not problems.found:  # a cost is estimated for a config that is right otherwise (it divides by its lengths)
        problems.run(check_randomized_positions, cfg, resolve_device(cfg.device))
    return problems.found


def task_problems(cfg) -> list[str]:
    """``task``: its options, every length holding one of its sequences, and nothing that reads text."""
    if cfg.task is None:
        return []
    try:
        task = build_task(cfg.task)
    except ValueError as e:
        return [str(e)]
    reading_text = [
        key
        for key, given in (
            ("probes", cfg.probes),
            ("train.copy_fraction", cfg.train.copy_fraction),
            ("train.copy_warmup_steps", cfg.train.copy_warmup_steps),
            ("train.copy_loss", cfg.train.copy_loss != "all"),
            ("train.copy_vocab", cfg.train.copy_vocab),
            ("train.val_lens", cfg.train.val_lens),
        )
        if given
    ]
    found = [f"task={task.cfg.name} trains on no text, which {key} needs; drop one of them" for key in reading_text]
    lengths = sorted({*train_lengths_of(cfg), *eval_lens_of(cfg)})
    if task.max_distance(lengths[0]) < 0:
        found.append(
            f"task={task.cfg.name}: a sequence needs at least {task.overhead() - 1} tokens (its source and query), "
            f"more than the length {lengths[0]} of train_len, train.lengths or eval_lens"
        )
    return found


def check_config(cfg) -> None:
    """Raise ProblemsFound with every problem of ``config_problems``: all of them in one line."""
    raise_problems(config_problems(cfg))
