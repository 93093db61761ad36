"""``posbench generate``: sample continuations from a saved run past its training length, with a key/value cache.

The run is loaded as ``posbench eval`` loads it (``saved_run.load_run``, in ``commands/generate.py``): its own
config, with the keys given on the command line replacing its values, so the evaluation-time variants apply as
there (``rope.scaling.*``, ``eval.window``, ``eval.blockwise``, ``eval.sink``, ``eval.attn_temperature``,
``model.logn_scaling``).

Prompts: ``generate.prompts`` N prompts of ``generate.prompt_len`` tokens from the test split, at evenly spaced
offsets (the same prompts for every run on the same data), or ``generate.text``, its whitespace-separated words
(words outside the vocabulary become ``<unk>``). Each is continued to ``generate.max_len`` tokens in all (prompt
included; ``null``: 16 x train_len), one token a step through the cache (``cache.py``), each drawn from
softmax(logits / ``temperature``) cut to the ``top_k`` most likely tokens (0: all) and to the smallest set whose
probability reaches ``top_p`` (1: all); temperature 0 takes the most likely token. A generator seeded with
``generate.seed`` draws. An encoding that cannot serve a length (learned positions past their table) stops
there with status ``unsupported``; what was generated up to then is kept.

Files, in the run folder or ``hydra.run.dir=DIR``; rows with the same identity (``SAMPLE_KEYS``: variant,
precision, seed, sampling options, prompt) replace the old ones, others are kept:

* ``samples.jsonl``, one object per prompt: ``SAMPLE_KEYS``, encoding, train_len, prompt_start (its offset in
  the test split), prompt_len, max_len, length (tokens in all), status, reason, degeneration_onset, and the
  prompt and generated tokens as text (``prompt``, ``generated``);
* ``generation.csv``, one row per prompt and window of ``generate.window`` generated positions from the end of
  the prompt on (``position``: the window's first; ``tokens``: how many it holds, fewer in the last):
  ``repetition``, the share of the window's tokens whose 4-gram (the token and the three before it) occurred
  earlier in the sample, prompt included; ``distinct_2``, distinct bigrams ending in the window over bigrams
  ending in it; ``nll``, the mean NLL of the sampled tokens under the model itself (temperature 1, uncut);
  and the prompt's ``degeneration_onset`` on each of its rows.

``degeneration_onset``: the first generated position p from which the rolling repetition (the share of
repeated 4-grams among the ``generate.window`` positions ending at each position) stays at or above
``generate.repetition_threshold`` for a whole window, positions p .. p + window - 1; empty when it never does.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from .data import UNK, Corpus
from .errors import PosbenchError, raise_problems
from .evaluate import variant_of
from .model import LanguageModel
from .runfolder import (
    GENERATION,
    MEASUREMENT_KEYS,
    SAMPLE_KEYS,
)
from .runtime import autocast
from .variant import AttentionVariant

log = logging.getLogger(__name__)

#: A sample is identified, within its run, by SAMPLE_KEYS; a generation.csv row by these and its ``position``.
GENERATION_KEYS = MEASUREMENT_KEYS[GENERATION]
GENERATION_COLUMNS = [
    "encoding",
    "train_len",
    *SAMPLE_KEYS,
    "position",
    "tokens",
    "repetition",
    "distinct_2",
    "nll",
    "degeneration_onset",
]
#: Repetition counts n-grams of this many tokens.
NGRAM = 4
#: ``generate.max_len=null``: this many times the training length.
DEFAULT_LENGTH_RATIO = 16


@dataclass
class GenerateConfig:
    #: Prompts from the test split (ignored with ``text``).
    prompts: int = 8
    #: Tokens per test-split prompt (``null``: half the training length).
    prompt_len: Optional[int] = None
    #: A prompt of your own, whitespace-separated words (``null``: prompts from the test split).
    text: Optional[str] = None
    #: Tokens per sample in all, prompt included (``null``: 16 x train_len).
    max_len: Optional[int] = None
    #: Softmax temperature; 0 takes the most likely token.
    temperature: float = 1.0
    #: Draw among the k most likely tokens only (0: all).
    top_k: int = 0
    #: Draw among the smallest set of tokens whose probability reaches p (nucleus sampling; 1: all).
    top_p: float = 1.0
    seed: int = 0
    #: Prompts decoded together.
    batch_size: int = 8
    #: Generated positions per generation.csv row, and the span of the degeneration onset.
    window: int = 64
    #: Rolling repetition at or above this for a whole window marks the degeneration onset.
    repetition_threshold: float = 0.5


def generate_problems(g) -> list[str]:
    """The rules of ``generate.*`` that need no run: all but those on the lengths that wait for its train_len."""
    rules = [
        ("prompts", g.prompts >= 1, "a positive integer"),
        ("prompt_len", g.prompt_len is None or g.prompt_len >= 1, "a positive integer or null"),
        ("temperature", 0 <= g.temperature < math.inf, "a number >= 0"),
        ("top_k", g.top_k >= 0, "an integer >= 0 (0: no cut)"),
        ("top_p", 0 < g.top_p <= 1, "in (0, 1]"),
        ("seed", 0 <= g.seed < 2**63, "an integer in [0, 2**63)"),
        ("batch_size", g.batch_size >= 1, "a positive integer"),
        ("window", g.window >= 1, "a positive integer"),
        ("repetition_threshold", 0 <= g.repetition_threshold <= 1, "in [0, 1]"),
    ]
    found = [f"generate.{key} must be {what}, got {g[key]}" for key, ok, what in rules if not ok]
    if g.text is not None and not g.text.split():
        found.append("generate.text holds no words; give some, or leave it out for prompts from the test split")
    return found


def length_problems(g, train_len: int | None) -> list[str]:
    """The sample must outlast its prompt; a length left null waits for ``train_len``."""
    prompt_len, max_len = lengths(g, train_len)
    if prompt_len is not None and max_len is not None and max_len < prompt_len:
        return [f"generate.max_len={max_len} is shorter than the prompt ({prompt_len} tokens)"]
    return []


def check_generate(g, train_len: int | None = None) -> None:
    """Every ``generate.*`` rule at once; those on lengths that default to a multiple of ``train_len`` once it is
    known."""
    raise_problems(generate_problems(g) + length_problems(g, train_len))


def lengths(g, train_len: int | None) -> tuple[int | None, int | None]:
    """(tokens per prompt, tokens per sample), ``None`` where it waits for ``train_len``."""
    prompt_len = len(g.text.split()) if g.text is not None else g.prompt_len
    if prompt_len is None and train_len is not None:
        prompt_len = max(1, train_len // 2)
    max_len = g.max_len if g.max_len is not None or train_len is None else DEFAULT_LENGTH_RATIO * train_len
    return prompt_len, max_len


@dataclass
class Prompt:
    source: str  # test | text
    prompt_id: int
    start: int | None  # offset in the test split
    tokens: Tensor  # (P,)


def prompts_of(corpus: Corpus, g, prompt_len: int) -> list[Prompt]:
    """``generate.text`` as one prompt, or ``generate.prompts`` evenly spaced windows of the test split."""
    if g.text is not None:
        index = {word: i for i, word in enumerate(corpus.vocab)}
        words = [index.get(w, index[UNK]) for w in g.text.split()]
        return [Prompt("text", 0, None, torch.tensor(words))]
    test = corpus.splits["test"]
    if len(test) < prompt_len:
        raise PosbenchError(f"the test split has {len(test)} tokens, fewer than generate.prompt_len={prompt_len}")
    starts = [i * (len(test) - prompt_len) // g.prompts for i in range(g.prompts)]
    return [Prompt("test", i, s, test[s : s + prompt_len]) for i, s in enumerate(starts)]


def pick(logits: Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator) -> Tensor:
    """Next tokens (B,) for logits (B, V), as the module docstring says."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        beyond = probs.cumsum(dim=-1) - probs >= top_p  # the tokens after the set has reached top_p
        logits = logits.scatter(-1, order, ordered.masked_fill(beyond, -math.inf))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


@dataclass
class Sampled:
    tokens: Tensor  # (B, n): prompt and continuation
    nll: Tensor  # (B, n - P): of each sampled token, under the model at temperature 1
    status: str  # ok | unsupported
    reason: str


@torch.no_grad()
def sample(model: LanguageModel, prompt: Tensor, max_len: int, g, generator: torch.Generator) -> Sampled:
    """Continue prompt (B, P) to ``max_len`` tokens, a token a step through a key/value cache."""
    model.eval()
    cache, pieces, nlls = model.new_cache(max_len), [prompt], []
    step_input, n, status, reason = prompt, prompt.shape[1], "ok", ""
    while n < max_len:
        why = model.encoding.unsupported_reason(n)  # this step's input reaches position n - 1
        if why:
            status, reason = "unsupported", why
            break
        with autocast(prompt.device, model.precision):
            logits = model.head(model(step_input, cache=cache)[:, -1]).float()  # (B, V)
        token = pick(logits, g.temperature, g.top_k, g.top_p, generator)
        nlls.append(-F.log_softmax(logits, dim=-1).gather(-1, token[:, None]))
        step_input, n = token[:, None], n + 1
        pieces.append(step_input)
    nll = torch.cat(nlls, dim=1) if nlls else prompt.new_zeros(len(prompt), 0, dtype=torch.float32)
    return Sampled(torch.cat(pieces, dim=1).cpu(), nll.cpu(), status, reason)


def repeated_ngrams(tokens: list[int], n: int = NGRAM) -> np.ndarray:
    """(len(tokens),): 1 where the n-gram ending at a position ended at an earlier one too, else 0; NaN before
    the first whole n-gram."""
    seen, out = set(), np.full(len(tokens), np.nan)
    for i in range(n - 1, len(tokens)):
        gram = tuple(tokens[i - n + 1 : i + 1])
        out[i] = gram in seen
        seen.add(gram)
    return out


def degeneration_onset(repeated: np.ndarray, prompt_len: int, window: int, threshold: float) -> int | None:
    """The module docstring's ``degeneration_onset`` of a sample whose ``repeated_ngrams`` are given."""
    flags = np.nan_to_num(repeated)  # no whole n-gram yet: not a repeat
    rolling = np.convolve(flags, np.ones(window))[: len(flags)] / window  # over the window ending at each position
    high = np.concatenate([[0], np.cumsum(rolling >= threshold)])
    stays = np.flatnonzero(high[window:] - high[:-window] == window)  # p: high at every position p .. p + window - 1
    stays = stays[stays >= prompt_len]
    return int(stays[0]) if len(stays) else None


def window_rows(tokens: list[int], nll: np.ndarray, prompt_len: int, window: int) -> list[dict]:
    """generation.csv's measures of one sample, per window of generated positions."""
    repeated, rows = repeated_ngrams(tokens), []
    for start in range(prompt_len, len(tokens), window):
        end = min(start + window, len(tokens))
        bigrams = [tuple(tokens[i - 1 : i + 1]) for i in range(max(start, 1), end)]
        rows.append(
            dict(
                position=start,
                tokens=end - start,
                repetition=float(np.nanmean(repeated[start:end])) if end > NGRAM - 1 else math.nan,
                distinct_2=len(set(bigrams)) / len(bigrams) if bigrams else math.nan,
                nll=float(nll[start - prompt_len : end - prompt_len].mean()),
            )
        )
    return rows


def describe_samples(prompts: list[Prompt], sampled: Sampled, corpus: Corpus, g, identity: dict):
    """(samples.jsonl objects, generation.csv rows) of a batch of prompts."""
    records, rows = [], []
    for prompt, tokens, nll in zip(prompts, sampled.tokens.tolist(), sampled.nll.numpy()):
        p = len(prompt.tokens)
        key = dict(identity, source=prompt.source, prompt_id=prompt.prompt_id)
        onset = degeneration_onset(repeated_ngrams(tokens), p, g.window, g.repetition_threshold)
        text = lambda ids: " ".join(corpus.vocab[i] for i in ids)  # noqa: E731
        records.append(
            dict(key, prompt_start=prompt.start, prompt_len=p, length=len(tokens), status=sampled.status)
            | dict(reason=sampled.reason, degeneration_onset=onset, prompt=text(tokens[:p]), generated=text(tokens[p:]))
        )
        rows += [dict(key, **row, degeneration_onset=onset) for row in window_rows(tokens, nll, p, g.window)]
    return records, rows


def generate_samples(
    model: LanguageModel, corpus: Corpus, cfg: DictConfig, g, device
) -> tuple[list[dict], pd.DataFrame]:
    """Samples of ``model`` (a run of config ``cfg``, in its evaluation-time variant) with the options ``g``
    (``generate.*``): samples.jsonl's records and generation.csv's rows."""
    prompt_len, max_len = lengths(g, cfg.train_len)
    prompts = prompts_of(corpus, g, prompt_len)
    e = cfg.eval
    identity = dict(encoding=cfg.encoding.name, train_len=cfg.train_len, variant=variant_of(cfg.encoding, e, cfg.model))
    identity |= dict(precision=model.precision, seed=g.seed, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p)
    generator = torch.Generator(device).manual_seed(g.seed)
    records, rows = [], []
    with model.attention.evaluated_as(AttentionVariant.of(e, cfg.model)):
        for i in range(0, len(prompts), g.batch_size):
            batch = prompts[i : i + g.batch_size]
            sampled = sample(model, torch.stack([p.tokens for p in batch]).to(device), max_len, g, generator)
            log.info(
                "prompts %d-%d: %d tokens each, %s", i, i + len(batch) - 1, sampled.tokens.shape[1], sampled.status
            )
            described = describe_samples(batch, sampled, corpus, g, identity)
            records, rows = records + described[0], rows + described[1]
    return records, pd.DataFrame(rows, columns=GENERATION_COLUMNS)
