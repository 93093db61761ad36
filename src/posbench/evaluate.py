"""Perplexity at a given window length.

Perplexity is exp of the token-weighted mean NLL over every predicted token of a split.
``nonoverlapping`` cuts the token stream into consecutive windows of eval_len (the last
one shorter) and scores every target in each window with the context the window gives.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from .config import eval_lens_of
from .data import Corpus
from .model import LanguageModel

log = logging.getLogger(__name__)

RESULT_COLUMNS = [
    "encoding", "train_len", "eval_len", "split", "eval_mode", "tokens", "nll", "ppl",
    "status", "reason", "seed", "params", "encoding_params", "run_dir",
]  # fmt: skip


@dataclass
class Score:
    nll_sum: float
    tokens: int

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


@torch.no_grad()
def score_nonoverlapping(model: LanguageModel, tokens: Tensor, eval_len: int, batch_tokens: int, device) -> Score:
    """NLL summed over every target tokens[1:], in consecutive windows of ``eval_len``."""
    model.eval()
    n_targets = len(tokens) - 1
    n_full = n_targets // eval_len
    starts = list(range(0, n_full * eval_len, eval_len))
    per_batch = max(1, batch_tokens // eval_len)
    batches = [(starts[i : i + per_batch], eval_len) for i in range(0, len(starts), per_batch)]
    if n_targets % eval_len:  # the shorter last window
        batches.append(([n_full * eval_len], n_targets % eval_len))
    total = 0.0
    for batch_starts, length in batches:
        x = torch.stack([tokens[s : s + length] for s in batch_starts]).to(device)
        y = torch.stack([tokens[s + 1 : s + length + 1] for s in batch_starts]).to(device)
        with autocast(device):
            total += model.token_nll(x, y).double().sum().item()
    return Score(total, n_targets)


def autocast(device):
    """bf16 autocast on CUDA; a no-op context on CPU (fp32 there)."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.device(device).type == "cuda")


def evaluate_lengths(model: LanguageModel, corpus: Corpus, cfg, device, run_dir) -> pd.DataFrame:
    """One row per (split, eval_len); lengths the encoding cannot serve are marked, not fatal."""
    rows = []
    base = dict(
        encoding=cfg.encoding.name, train_len=cfg.train_len, eval_mode=cfg.eval.mode, seed=cfg.seed,
        params=model.num_params(), encoding_params=sum(p.numel() for p in model.encoding.parameters()),
        run_dir=str(run_dir),
    )  # fmt: skip
    for split in cfg.eval.splits:
        tokens = corpus.splits[split][: cfg.eval.max_tokens]
        for eval_len in eval_lens_of(cfg):
            reason = model.encoding.unsupported_reason(eval_len)
            if reason:
                log.warning("eval_len %d skipped: %s", eval_len, reason)
                rows.append(dict(base, split=split, eval_len=eval_len, tokens=len(tokens) - 1, status="unsupported", reason=reason))
                continue
            t0 = time.perf_counter()
            score = score_nonoverlapping(model, tokens, eval_len, cfg.eval.batch_tokens, device)
            log.info("%s eval_len=%d ppl=%.2f (%.1fs)", split, eval_len, score.ppl, time.perf_counter() - t0)
            rows.append(dict(base, split=split, eval_len=eval_len, tokens=score.tokens, nll=score.nll, ppl=score.ppl, status="ok", reason=""))
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)
