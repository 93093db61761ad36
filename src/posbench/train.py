"""``posbench train``: train one LM, keep the best checkpoint, write perplexity at every eval length.

Nothing is lost on interruption: every ``train.checkpoint_every`` steps, at the last step and on
SIGINT/SIGTERM the whole training state goes to ``last.pt`` (model, optimizer, scheduler, step,
tokens seen, every RNG state including the data sampler's, the best model so far, the log).
``train.resume=auto`` continues from it, and the resumed run ends with exactly the numbers of an
uninterrupted one; a run folder whose results.csv is complete for the same config is skipped.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from . import distributed
from .checkpoint import CHECKPOINT, RESUME_CHECKPOINT, load_checkpoint, save_checkpoint
from .config import check_config, eval_lens_of
from .data import load_corpus
from .errors import PosbenchError
from .evaluate import autocast, evaluate_lengths, score_nonoverlapping
from .io import write_csv
from .logger import open_logger
from .model import LanguageModel

log = logging.getLogger(__name__)

#: Keys that may differ between a run and its resumption: they do not change a single number.
RESUME_IGNORED = ("train.resume", "train.checkpoint_every", "debug", "device", "data.path", "threads", "logger")
#: Spike detection compares each step with a running average over about the last 1 / (1 - decay) steps.
SPIKE_AVERAGE_DECAY = 0.9


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: LanguageModel, cfg) -> torch.optim.AdamW:
    # Decay matrices only; norms, biases and the encoding's own few parameters are left alone.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("encoding.") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """``batch_size`` random windows of ``seq_len`` inputs and their next-token targets."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([tokens[s : s + seq_len] for s in starts])
    y = torch.stack([tokens[s + 1 : s + seq_len + 1] for s in starts])
    return x, y


@dataclass
class Progress:
    """What the loop accumulates; saved whole in last.pt."""

    step: int = 0
    tokens_seen: int = 0
    best_val: float = math.inf
    best_step: int = 0
    best_model: dict | None = None
    log_rows: list[dict] = field(default_factory=list)
    loss_average: float | None = None
    grad_average: float | None = None

    def spikes(self, step: int, train_loss: float, grad: float, t) -> tuple[bool, bool]:
        """Whether this step's loss and gradient norm jumped above their running averages (logged
        as a warning), then fold them into the averages."""
        loss_spike = self.loss_average is not None and train_loss > t.loss_spike_ratio * self.loss_average
        grad_spike = self.grad_average is not None and grad > t.grad_spike_ratio * self.grad_average
        if loss_spike or grad_spike:
            log.warning("step %d: spike: train loss %.3f (average %.3f), gradient norm %.3g (average %.3g)",
                        step, train_loss, self.loss_average, grad, self.grad_average)  # fmt: skip
        self.loss_average = running_average(self.loss_average, train_loss)
        self.grad_average = running_average(self.grad_average, grad)
        return loss_spike, grad_spike


def running_average(average: float | None, value: float) -> float:
    return value if average is None else SPIKE_AVERAGE_DECAY * average + (1 - SPIKE_AVERAGE_DECAY) * value


def flatten(tree, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    if isinstance(tree, dict) and tree:
        return {k: v for key, value in tree.items() for k, v in flatten(value, f"{prefix}.{key}" if prefix else str(key)).items()}
    return {prefix: tree}


def config_differences(saved, current) -> list[str]:
    """``key: saved -> current`` for every setting that changes the numbers (RESUME_IGNORED left out)."""
    a = flatten(OmegaConf.to_container(OmegaConf.create(saved), resolve=True))
    b = flatten(OmegaConf.to_container(current, resolve=True))
    keys = [k for k in sorted(a.keys() | b.keys()) if not any(k == i or k.startswith(f"{i}.") for i in RESUME_IGNORED)]
    absent = "(absent)"
    return [f"{k}: {a.get(k, absent)} -> {b.get(k, absent)}" for k in keys if a.get(k, absent) != b.get(k, absent)]


def mismatch(what: str, differences: list[str]) -> PosbenchError:
    shown = "; ".join(differences[:3]) + (f"; and {len(differences) - 3} more" if len(differences) > 3 else "")
    return PosbenchError(f"{what} has another config ({shown}); pass train.resume=false to start afresh, or use another run folder")


def finished_run(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The metrics of a run already finished in ``run_dir`` with this config (results.csv complete), else None."""
    results_path, best_path = run_dir / "results.csv", run_dir / CHECKPOINT
    if str(cfg.train.resume).lower() not in ("auto", "true") or not (results_path.is_file() and best_path.is_file()):
        return None
    best = load_checkpoint(best_path)
    differences = config_differences(best["config"], cfg)
    if differences:
        raise mismatch(f"{run_dir} holds a finished run that", differences)
    try:
        results = pd.read_csv(results_path)
        measured = set(zip(results["split"], results["eval_len"]))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, KeyError):
        return None  # not a complete results.csv: train (or resume) and write it again
    if not {(split, eval_len) for split in cfg.eval.splits for eval_len in eval_lens_of(cfg)} <= measured:
        return None
    return {"best_valid_loss": best["valid_loss"], "results": results}


def resume_source(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The last.pt that ``train.resume`` asks to continue from, or None to start afresh."""
    choice = str(cfg.train.resume)
    if choice.lower() == "false":
        return None
    if choice.lower() in ("auto", "true"):
        path = run_dir / RESUME_CHECKPOINT
        if choice.lower() == "true" and not path.is_file():
            raise PosbenchError(f"train.resume=true but {run_dir} holds no {RESUME_CHECKPOINT} to resume from")
        return path if path.is_file() else None
    path = Path(choice).expanduser()
    return path / RESUME_CHECKPOINT if path.is_dir() else path


def resume_state(model, optimizer, scheduler, gen, progress: Progress, cfg, vocab) -> dict:
    """Everything last.pt holds: with it, training continues as if it had never stopped."""
    return {
        "model": model.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True), "vocab": vocab,
        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "rng": {**rng_states(), "data": gen.get_state()}, "progress": vars(progress),
    }  # fmt: skip


def restore(path: Path, model, optimizer, scheduler, gen, cfg, vocab) -> Progress:
    """Put the training state of ``path`` (a last.pt) back in place; returns the loop's progress."""
    state = load_checkpoint(path, encoding=cfg.encoding.name, vocab=vocab)
    missing = sorted({"optimizer", "scheduler", "rng", "progress"} - state.keys())
    if missing:
        raise PosbenchError(f"checkpoint {path} holds no training state (no {', '.join(missing)}); resume needs a {RESUME_CHECKPOINT}")
    differences = config_differences(state["config"], cfg)
    if differences:
        raise mismatch(f"checkpoint {path}", differences)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    gen.set_state(state["rng"]["data"])
    set_rng_states(state["rng"])
    return Progress(**state["progress"])


@contextlib.contextmanager
def signals_deferred():
    """SIGINT/SIGTERM only set a flag (the loop checkpoints, then stops); a second one stops at once."""
    caught: list[str] = []

    def handler(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield caught
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train (or resume), keep the best model by validation loss, evaluate it; returns the final metrics."""
    check_config(cfg)
    world = distributed.setup()  # one process alone, or this rank's place under torchrun / SLURM
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    done = finished_run(cfg, run_dir)
    if done is not None:
        log.info("%s already holds this run, finished (train.resume=false runs it again)", run_dir)
        return done
    device = world.device(resolve_device(cfg.device))
    seed_everything(cfg.seed)
    corpus = load_corpus(cfg.data)
    model = LanguageModel(cfg.model, cfg.encoding, corpus.vocab_size, cfg.train_len).to(device)
    log.info("model: %s params, encoding %s, device %s, %d rank(s), torch threads %d",
             f"{model.num_params():,}", cfg.encoding.name, device, world.size, torch.get_num_threads())  # fmt: skip
    t = cfg.train
    optimizer = make_optimizer(model, t)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, t.warmup_steps, t.steps, t.min_lr_ratio)
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    train_tokens, valid_tokens = corpus.splits["train"], corpus.splits["valid"][: t.val_tokens]
    if len(train_tokens) <= cfg.train_len + 1:
        raise PosbenchError(f"the train split has {len(train_tokens)} tokens, too few for train_len={cfg.train_len}")
    source = resume_source(cfg, run_dir)
    progress = restore(source, model, optimizer, scheduler, gen, cfg, corpus.vocab) if source else Progress()
    if source:
        log.info("resumed from %s at step %d of %d", source, progress.step, t.steps)
    loss_fn, rows = distributed.training_loss(model, world, device), world.batch_slice(t.batch_size)
    logger = open_logger(cfg.logger, run_dir, world.is_main)

    def save_resume_state() -> None:
        if not world.is_main:
            return
        save_checkpoint(run_dir / RESUME_CHECKPOINT, resume_state(model, optimizer, scheduler, gen, progress, cfg, corpus.vocab))
        write_csv(pd.DataFrame(progress.log_rows), run_dir / "train_log.csv")

    def stop_non_finite(what: str, value: float, step: int) -> None:
        progress.log_rows.append(dict(step=step, tokens=progress.tokens_seen, train_loss=value if what == "training loss" else None))
        if world.is_main:
            write_csv(pd.DataFrame(progress.log_rows), run_dir / "train_log.csv")
        kept = f"{CHECKPOINT} (best, step {progress.best_step})" if progress.best_step else "no checkpoint yet"
        raise PosbenchError(
            f"{what} is {value} at step {step}; training stopped, {kept} kept; "
            "try a lower train.lr, more train.warmup_steps or a smaller train.grad_clip"
        )

    t_last = time.perf_counter()
    bar = tqdm(total=t.steps, initial=progress.step, desc=f"train {cfg.encoding.name}", disable=not (sys.stderr.isatty() and world.is_main), dynamic_ncols=True)
    with signals_deferred() as caught:
        for step in range(progress.step + 1, t.steps + 1):
            model.train()
            x, y = sample_batch(train_tokens, t.batch_size, cfg.train_len, gen)
            with autocast(device):
                loss = loss_fn(x[rows].to(device), y[rows].to(device)).mean()  # this rank's share of the global batch
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            train_loss, grad = world.mean(loss), grad_norm.item()  # the whole batch's loss; DDP already averaged grads
            for what, value in (("training loss", train_loss), ("gradient norm", grad)):
                if not math.isfinite(value):
                    stop_non_finite(what, value, step)
            optimizer.step()
            scheduler.step()
            bar.update()
            progress.step, progress.tokens_seen = step, progress.tokens_seen + x.numel()

            loss_spike, grad_spike = progress.spikes(step, train_loss, grad, t)

            val_loss = None
            if world.is_main and (step % t.eval_every == 0 or step == t.steps):  # the other ranks wait in the next step
                val_loss = score_nonoverlapping(model, valid_tokens, cfg.train_len, cfg.eval.batch_tokens, device).nll
                if not math.isfinite(val_loss):
                    stop_non_finite("validation loss", val_loss, step)
                if val_loss < progress.best_val:
                    progress.best_val, progress.best_step, progress.best_model = val_loss, step, copy.deepcopy(model.state_dict())
                    save_checkpoint(run_dir / CHECKPOINT, {
                        "model": model.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True),
                        "vocab": corpus.vocab, "step": step, "valid_loss": val_loss,
                    })  # fmt: skip
            if step % t.log_every == 0 or val_loss is not None or loss_spike or grad_spike:
                now = time.perf_counter()
                steps_since = step % t.log_every or t.log_every
                tok_s = steps_since * x.numel() / max(now - t_last, 1e-9)
                t_last = now
                progress.log_rows.append(dict(
                    step=step, tokens=progress.tokens_seen, train_loss=train_loss, lr=scheduler.get_last_lr()[0],
                    grad_norm=grad, valid_loss=val_loss, tokens_per_s=tok_s, loss_spike=loss_spike, grad_spike=grad_spike,
                ))  # fmt: skip
                logger.log_step(progress.log_rows[-1])
                bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tok_s:,.0f}")
                if val_loss is not None:
                    log.info("step %d: train %.3f valid %.3f (best %.3f)", step, train_loss, val_loss, progress.best_val)
            if step % t.checkpoint_every == 0 or step == t.steps or caught:
                save_resume_state()
            if caught:
                raise PosbenchError(
                    f"stopped by {caught[0]} at step {step} of {t.steps}; the state is saved in {run_dir / RESUME_CHECKPOINT}; "
                    f"to continue, run the same command in the same folder (hydra.run.dir={run_dir}, or a sweep's hydra.sweep.dir)"
                )
    bar.close()
    if not world.is_main:
        return {}  # rank 0 evaluates and writes
    write_csv(pd.DataFrame(progress.log_rows), run_dir / "train_log.csv")

    model.load_state_dict(progress.best_model)
    results = evaluate_lengths(model, corpus, cfg, device, run_dir)
    write_csv(results, run_dir / "results.csv")
    logger.log_results(results)
    logger.close()
    (run_dir / RESUME_CHECKPOINT).unlink(missing_ok=True)  # finished: results.csv and checkpoint.pt say all
    return {"best_valid_loss": progress.best_val, "results": results}
