"""``posbench train``: train one LM, keep the best checkpoint, write perplexity at every eval length."""

from __future__ import annotations

import copy
import logging
import math
import random
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from .checkpoint import CHECKPOINT, save_checkpoint
from .config import check_config
from .data import Corpus, load_corpus
from .evaluate import autocast, evaluate_lengths, score_nonoverlapping
from .errors import PosbenchError
from .io import write_csv
from .model import LanguageModel

log = logging.getLogger(__name__)

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


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


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train, keep the best model by validation loss, evaluate it; returns the final metrics."""
    check_config(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    corpus = load_corpus(cfg.data)
    model = LanguageModel(cfg.model, cfg.encoding, corpus.vocab_size, cfg.train_len).to(device)
    log.info("model: %s params, encoding %s, device %s", f"{model.num_params():,}", cfg.encoding.name, device)
    t = cfg.train
    optimizer = make_optimizer(model, t)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, t.warmup_steps, t.steps, t.min_lr_ratio)
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    train_tokens, valid_tokens = corpus.splits["train"], corpus.splits["valid"][: t.val_tokens]
    if len(train_tokens) <= cfg.train_len + 1:
        raise PosbenchError(f"the train split has {len(train_tokens)} tokens, too few for train_len={cfg.train_len}")

    log_rows, best_val, best_state = [], float("inf"), None
    tokens_seen, t_last = 0, time.perf_counter()
    bar = tqdm(range(t.steps), desc=f"train {cfg.encoding.name}", disable=not sys.stderr.isatty(), dynamic_ncols=True)
    for step in bar:
        model.train()
        x, y = sample_batch(train_tokens, t.batch_size, cfg.train_len, gen)
        with autocast(device):
            loss = model.token_nll(x.to(device), y.to(device)).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        scheduler.step()
        tokens_seen += x.numel()

        last = step + 1 == t.steps
        val_loss = None
        if (step + 1) % t.eval_every == 0 or last:
            val_loss = score_nonoverlapping(model, valid_tokens, cfg.train_len, cfg.eval.batch_tokens, device).nll
            if val_loss < best_val:
                best_val, best_state = val_loss, copy.deepcopy(model.state_dict())
                save_checkpoint(run_dir / CHECKPOINT, {
                    "model": model.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True),
                    "vocab": corpus.vocab, "step": step + 1, "valid_loss": best_val,
                })  # fmt: skip
        if (step + 1) % t.log_every == 0 or val_loss is not None:
            now = time.perf_counter()
            steps_since = (step + 1) % t.log_every or t.log_every
            tok_s = steps_since * x.numel() / max(now - t_last, 1e-9)
            t_last = now
            log_rows.append(dict(
                step=step + 1, tokens=tokens_seen, train_loss=loss.item(), lr=scheduler.get_last_lr()[0],
                grad_norm=grad_norm.item(), valid_loss=val_loss, tokens_per_s=tok_s,
            ))  # fmt: skip
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tok_s:,.0f}")
            if val_loss is not None:
                log.info("step %d: train %.3f valid %.3f (best %.3f)", step + 1, loss.item(), val_loss, best_val)
    write_csv(pd.DataFrame(log_rows), run_dir / "train_log.csv")

    model.load_state_dict(best_state)
    results = evaluate_lengths(model, corpus, cfg, device, run_dir)
    write_csv(results, run_dir / "results.csv")
    return {"best_valid_loss": best_val, "results": results}
