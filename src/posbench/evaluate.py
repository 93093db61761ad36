"""Perplexity at a given window length, per position in the window, and a context-free reference.

Perplexity is exp of the token-weighted mean NLL over every predicted token of a split.
The token stream is scored in windows of eval_len that advance by ``stride`` tokens; each
target is scored once, by the first window that reaches it, with all the context that
window gives (the first window scores all its targets).

* ``nonoverlapping`` (the ALiBi paper's protocol): stride = eval_len, windows side by side;
  early targets of every window see little context.
* ``sliding``: stride S < eval_len; after the first window every target sees at least
  eval_len - S tokens of context. S = eval_len is exactly ``nonoverlapping``.

Beside results.csv, the same scoring pass gives per_position.csv (mean NLL at each window position)
and per_article.csv (summed NLL of each article's targets, a target counting for the article it is in).
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from .data import UNK, Corpus
from .lengths import eval_lens_of, train_lengths_label
from .model import LanguageModel
from .positional import ENCODINGS, encoding_config
from .runfolder import (
    PER_ARTICLE,
    PER_ARTICLE_COLUMNS,
    PER_POSITION,
    PER_POSITION_COLUMNS,
    RESULT_COLUMNS,
    RESULTS,
    ModelState,
    earlier_measurement,
    measured_rows,
    merge_rows,
)
from .variant import AttentionVariant

log = logging.getLogger(__name__)


@dataclass
class Score:
    """Summed NLL and number of scored targets at each window position, both (eval_len,), and the NLL of
    every target of the split, (n_targets,)."""

    nll_sum: Tensor  # float64
    count: Tensor  # int64
    target_nll: Tensor  # float64

    @property
    def tokens(self) -> int:
        return int(self.count.sum())

    @property
    def nll(self) -> float:
        return self.nll_sum.sum().item() / self.tokens

    @property
    def ppl(self) -> float:
        return exp_or_inf(self.nll)

    def ppl_from(self, position: int) -> float | None:
        """Perplexity of the targets at window positions >= ``position`` (``None`` if there are none)."""
        count = int(self.count[position:].sum())
        return exp_or_inf(self.nll_sum[position:].sum().item() / count) if count else None


def exp_or_inf(nll: float) -> float:
    """exp(nll), infinite past float range (math.exp raises there)."""
    return math.exp(nll) if nll < 709 else math.inf


def windows(n_targets: int, eval_len: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, length, first scored index) of every window, so that each target is scored once."""
    if not 1 <= stride <= eval_len:
        raise ValueError(f"stride must be in [1, eval_len={eval_len}], got {stride}")
    out, scored, start = [], 0, 0
    while scored < n_targets:
        end = min(start + eval_len, n_targets)
        out.append((start, end - start, scored - start))
        scored, start = end, start + stride
    return out


@torch.no_grad()
def score_windows(model: LanguageModel, tokens: Tensor, eval_len: int, stride: int, batch_tokens: int, device) -> Score:
    """Score every target tokens[1:] once, in windows of ``eval_len`` advancing by ``stride``."""
    model.eval()
    nll_sum = torch.zeros(eval_len, dtype=torch.float64)
    count = torch.zeros(eval_len, dtype=torch.int64)
    target_nll = torch.full((len(tokens) - 1,), math.nan, dtype=torch.float64)  # unscored: NaN, never a silent 0
    by_length: dict[int, list[tuple[int, int]]] = {}  # windows of one length batch together
    for start, length, first in windows(len(tokens) - 1, eval_len, stride):
        by_length.setdefault(length, []).append((start, first))
    for length, group in by_length.items():
        per_batch = max(1, batch_tokens // length)
        for i in range(0, len(group), per_batch):
            batch = group[i : i + per_batch]
            x = torch.stack([tokens[s : s + length] for s, _ in batch]).to(device)  # (B, length)
            y = torch.stack([tokens[s + 1 : s + length + 1] for s, _ in batch]).to(device)  # (B, length)
            nll = model.token_nll(x, y).double().cpu()  # (B, length)
            scored = torch.arange(length)[None, :] >= torch.tensor([f for _, f in batch])[:, None]  # (B, length)
            nll_sum[:length] += (nll * scored).sum(0)
            count[:length] += scored.sum(0)
            target = torch.tensor([s for s, _ in batch])[:, None] + torch.arange(length)  # (B, length)
            target_nll[target[scored]] = nll[scored]
    return Score(nll_sum, count, target_nll)


def score_nonoverlapping(model: LanguageModel, tokens: Tensor, eval_len: int, batch_tokens: int, device) -> Score:
    """Consecutive windows of ``eval_len`` (the last one shorter)."""
    return score_windows(model, tokens, eval_len, eval_len, batch_tokens, device)


def unigram_ppl(train: Tensor, targets: Tensor, vocab: list[str]) -> float:
    """Perplexity of ``targets`` under the training split's token frequencies: a model that ignores context.

    Same vocabulary and ``<unk>`` id as the model. Only ``<unk>`` can be absent from train
    (in partial slices); it is then counted once so that no target has probability zero.
    """
    counts = torch.bincount(train, minlength=len(vocab)).double()  # (V,)
    unk = vocab.index(UNK)
    counts[unk] = counts[unk].clamp(min=1)
    log_p = counts.log() - counts.sum().log()
    return math.exp(-log_p[targets].mean().item())


def per_position_rows(score: Score, exact: int, bucket: int) -> pd.DataFrame:
    """Mean NLL per window position: one row per position below ``exact``, then one per ``bucket`` positions.

    ``position`` is the first position of its bucket; positions no window scored are left out.
    """
    pos = torch.arange(len(score.count))
    key = torch.where(pos < exact, pos, exact + (pos - exact) // bucket * bucket)
    df = pd.DataFrame({"position": key.numpy(), "nll_sum": score.nll_sum.numpy(), "count": score.count.numpy()})
    df = df.groupby("position", as_index=False).sum()
    df = df[df["count"] > 0]
    return df.assign(nll=df["nll_sum"] / df["count"])[["position", "nll", "count"]]


def per_article_rows(score: Score, article: Tensor) -> pd.DataFrame:
    """Scored targets and their summed NLL per article; ``article`` holds each target's article, (n_targets,)."""
    n_articles = int(article.max()) + 1
    nll_sum = torch.zeros(n_articles, dtype=torch.float64).index_add_(0, article, score.target_nll)
    tokens = torch.bincount(article, minlength=n_articles)
    return pd.DataFrame({"article": range(n_articles), "tokens": tokens.numpy(), "nll_sum": nll_sum.numpy()})


#: The label of a model trained at randomized positions (``randpos8192``): the part of a variant that
#: says how the model was trained; every other label says how it was evaluated.
RANDOMIZED_LABEL = "randpos"


def variant_of(encoding_cfg, eval_cfg=None, model_cfg=None) -> str:
    """The variant: the training-side randomized positions (``randpos8192``) and the evaluation-time
    variant: the encoding's (e.g. ``yarn×4``), log-n scaling's (``logn``, from ``model_cfg``) and the
    attention's from ``eval_cfg`` (``window256``, ``blockwise128``, ``sink4``, ``temp1.2``), joined by ``+``; empty
    for a model trained and evaluated plainly."""
    config = encoding_config(encoding_cfg)
    labels = ["" if config.randomized_positions is None else f"{RANDOMIZED_LABEL}{config.randomized_positions}"]
    labels.append(ENCODINGS[config.name][1].variant_label(config))
    labels.append(AttentionVariant.of(eval_cfg, model_cfg).label())
    return "+".join(label for label in labels if label)


def variant_parts(variant: str) -> tuple[str, str]:
    """A ``variant_of`` name split into how the model was trained and how it was evaluated:
    ``randpos8192+window256`` -> (``randpos8192``, ``window256``)."""
    labels = variant.split("+") if variant else []
    trained = [label for label in labels if re.fullmatch(rf"{RANDOMIZED_LABEL}\d+", label)]
    return "+".join(trained), "+".join(label for label in labels if label not in trained)


def not_measurable(model: LanguageModel, tokens: Tensor, split: str, eval_len: int, max_tokens) -> tuple[str, str]:
    """(status, reason) for a length that cannot be measured (``unsupported``, ``too_short``), else ("", "").

    A split shorter than one window would score its few targets again at every longer length and
    call them that length's perplexity.
    """
    reason = model.encoding.unsupported_reason(eval_len)
    if reason:
        return "unsupported", reason
    if len(tokens) - 1 < eval_len:
        cap = f" (eval.max_tokens={max_tokens})" if max_tokens is not None else ""
        return "too_short", f"the {split} split has {len(tokens) - 1} targets{cap}, fewer than one window of {eval_len}"
    return "", ""


def evaluate_lengths(
    model: LanguageModel,
    corpus: Corpus,
    cfg,
    device,
    run_dir,
    state: ModelState,
    columns: dict | None = None,
    keep_measured: bool = False,
) -> pd.DataFrame:
    """One row per (split, eval_len) of the model in ``state``, each merged into ``run_dir/results.csv`` (with
    ``columns`` added) as soon as it is measured, after its per-position loss (per_position.csv) and
    per-article loss (per_article.csv): a row in results.csv says its length is whole.

    ``keep_measured``: a length an earlier, interrupted attempt to finish the same run already measured on
    these weights (``runfolder.measured_rows``) is kept, not measured again; only training's finish may ask
    for it, since only resuming guarantees the same config.

    The evaluation-time variant of ``eval.*`` and ``model.logn_scaling`` changes the attention (variant.py).
    """
    with model.attention.evaluated_as(AttentionVariant.of(cfg.eval, cfg.model)):
        return score_lengths(model, corpus, cfg, device, Path(run_dir), state, columns or {}, keep_measured)


def score_lengths(
    model: LanguageModel, corpus: Corpus, cfg, device, run_dir: Path, state: ModelState, columns, keep_measured
) -> pd.DataFrame:
    """``evaluate_lengths`` in the attention window already set."""
    e = cfg.eval
    base = dict(
        encoding=cfg.encoding.name,
        variant=variant_of(cfg.encoding, e, cfg.model),
        train_len=cfg.train_len,
        train_lengths=train_lengths_label(cfg),
        eval_mode=e.mode,
        seed=cfg.seed,
        params=model.num_params(),
        encoding_params=sum(p.numel() for p in model.encoding_parameters()),
        run_dir=str(run_dir),
        precision=model.precision,
    )
    kept = measured_rows(run_dir, RESULTS, state) if keep_measured else pd.DataFrame()
    rows = []
    for split in e.splits:
        tokens = corpus.splits[split][: e.max_tokens]
        target_article = corpus.article_ids(split, len(tokens))[1:]
        reference = unigram_ppl(corpus.splits["train"], tokens[1:], corpus.vocab)
        for eval_len in eval_lens_of(cfg):
            stride = min(e.stride, eval_len) if e.mode == "sliding" else eval_len
            where = dict(base, split=split, eval_len=eval_len, stride=stride, unigram_ppl=reference)
            row = earlier_measurement(kept, where, RESULTS)
            if row is not None:
                log.info(
                    "%s eval_len=%d: kept, measured on these weights before the run was interrupted", split, eval_len
                )
            else:
                row = score_length(model, cfg, device, tokens, target_article, where, run_dir, state) | columns
                merge_rows(run_dir, RESULTS, pd.DataFrame([row], columns=RESULT_COLUMNS), state)
            rows.append(row)
    return pd.DataFrame(rows, columns=RESULT_COLUMNS).assign(**state.columns())


def score_length(
    model: LanguageModel, cfg, device, tokens: Tensor, target_article: Tensor, where: dict, run_dir, state
) -> dict:
    """One results.csv row (``where`` and the measurement), its per-position and per-article rows merged first.

    A length the encoding cannot serve (``unsupported``), the split cannot fill (``too_short``) or the model
    scores as NaN or infinite (``nonfinite``) is marked, not fatal.
    """
    e, split, eval_len = cfg.eval, where["split"], where["eval_len"]
    status, reason = not_measurable(model, tokens, split, eval_len, e.max_tokens)
    if status:
        log.warning("%s eval_len %d skipped: %s", split, eval_len, reason)
        return dict(where, tokens=len(tokens) - 1, status=status, reason=reason)
    score = timed_score(model, tokens, eval_len, where["stride"], e.batch_tokens, device, split)
    if not math.isfinite(score.nll):
        reason = f"the mean NLL is {score.nll} (NaN or infinite): the model's scores overflowed"
        log.warning("%s eval_len %d: %s", split, eval_len, reason)
        return dict(where, tokens=score.tokens, status="nonfinite", reason=reason)
    positions = per_position_rows(score, e.per_position_exact, e.per_position_bucket).assign(**where)
    merge_rows(run_dir, PER_POSITION, positions[PER_POSITION_COLUMNS], state)
    merge_rows(
        run_dir, PER_ARTICLE, per_article_rows(score, target_article).assign(**where)[PER_ARTICLE_COLUMNS], state
    )
    beyond = score.ppl_from(cfg.train_len) if eval_len > cfg.train_len else None
    return dict(where, tokens=score.tokens, nll=score.nll, ppl=score.ppl, ppl_beyond=beyond, status="ok", reason="")


def timed_score(model: LanguageModel, tokens: Tensor, eval_len: int, stride: int, batch_tokens: int, device, split):
    t0 = time.perf_counter()
    score = score_windows(model, tokens, eval_len, stride, batch_tokens, device)
    log.info("%s eval_len=%d stride=%d ppl=%.2f (%.1fs)", split, eval_len, stride, score.ppl, time.perf_counter() - t0)
    return score
