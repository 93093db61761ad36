"""Which copy sequences teach a model to copy by content (an induction head), not by a fixed offset?

Trains posbench's model (``--model``: conf/model's task preset by default, without dropout; AdamW at ``--lr``) on copy
sequences of the training text's 128 most frequent words (``train.copy_vocab=128``'s words) under one
``--curriculum``, then measures copying the way the copy probe does, on fresh sequences of those words: a span
of S = min(32, length / 4) tokens, d tokens of text, the span again; accuracy (top-1) and gain (nats, against a
different first span) on its tokens 2..S, at each d of ``--distances``. Prints the mean training loss of each
100 steps, then that table. Chance accuracy is 1/128 = 0.008.

Curricula (sequences of ``--length`` + 1 tokens, L below; the loss on the repeated span's tokens 2..S only):
  warmup   the pure-copy warm-up of ``train.copy_warmup_steps``: an L/2-token span repeated at once (after 0 or
           1 token of text), so the copy always sits L/2 tokens back
  mixed    a span of S tokens, d uniform in 0..L+1-2S tokens of text, the span again, text after: the copy
           sequences of ``train.copy_fraction``, whose offsets vary
  lengths  a span of uniform length 8..L/2 repeated at once, text after: offsets vary, no filler around it

Usage: PYTHONPATH=src python scripts/copy_curriculum.py --encoding rope --curriculum mixed [--length 64 --batch 32]
       PYTHONPATH=src python scripts/copy_curriculum.py --checkpoint RUN_DIR [--span 16]
With ``--checkpoint``, trains nothing: measures a saved run (a copy-trained LM) the same way, on spans of the
words its warm-up copied (its train.copy_vocab) and on spans of every word (the copy probe's), to 4 x its train_len.
"""

from __future__ import annotations

import argparse
from importlib.resources import files

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from posbench.copyseq import copy_symbols
from posbench.data import DataConfig, load_corpus
from posbench.errors import PosbenchError
from posbench.model import LanguageModel, ModelConfig
from posbench.probes.copy import default_logits_fn, score_copies, summarize
from posbench.saved_run import load_run
from posbench.tasks.base import IGNORE

SPAN = 32  # the copy probe's span (probe.span), at most a quarter of the length


def copy_row(rng, symbols, text, length: int, span: int, distance: int) -> tuple[torch.Tensor, slice]:
    """A row of length + 1 tokens: span, d tokens of text, the span again, text; and the targets' slice of the
    repeat."""
    copied = symbols[torch.from_numpy(rng.integers(0, len(symbols), span))]
    offset = int(rng.integers(0, len(text) - length))
    filler = text[offset : offset + length + 1 - 2 * span]
    row = torch.cat([copied, filler[:distance], copied, filler[distance:]])
    start = span + distance  # the repeat's first token; its tokens 2..span are the targets start..start+span-2
    return row, slice(start, start + span - 1)


def batch(rng, symbols, text, curriculum: str, size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, targets, span = [], [], min(SPAN, length // 4)
    for _ in range(size):
        if curriculum == "warmup":
            row, scored = copy_row(rng, symbols, text, length, length // 2, int(rng.integers(0, 2)))
        elif curriculum == "mixed":
            row, scored = copy_row(rng, symbols, text, length, span, int(rng.integers(0, length + 2 - 2 * span)))
        else:
            row, scored = copy_row(rng, symbols, text, length, int(rng.integers(8, length // 2 + 1)), 0)
        y = torch.full((length,), IGNORE)
        y[scored] = row[1:][scored]
        rows.append(row[:-1]), targets.append(y)
    return torch.stack(rows), torch.stack(targets)


def measure(model, rng, symbols, text, span: int, distance: int, trials: int = 64) -> dict:
    """The copy probe's scores (``probes.copy.summarize``) of a span repeated after d tokens of text, against a
    different first span."""
    length = 2 * span + distance
    x = torch.stack([copy_row(rng, symbols, text, length, span, distance)[0] for _ in range(trials)])[:, :length]
    baseline = x.clone()
    baseline[:, :span] = symbols[torch.from_numpy(rng.integers(0, len(symbols), (trials, span)))]
    nll, hit = score_copies(default_logits_fn(model), torch.cat([x, baseline]), span, 2 * trials * length, "cpu")
    return summarize(nll, hit, trials)


def measure_saved(checkpoint: str, span: int, seed: int) -> None:
    """The table of a saved run, on spans of its warm-up's words (train.copy_vocab, else 128) and of every word, d
    from 0 to 4 x train_len."""
    run = load_run(OmegaConf.create({"checkpoint": checkpoint, "device": "cpu", "threads": 1}), ["device", "threads"])
    text, vocab_size, train_len = run.corpus.splits["train"], run.corpus.vocab_size, run.cfg.train_len
    taught, model = run.cfg.train.copy_vocab or 128, run.model.eval()
    print(f"{checkpoint} (step {run.state.step}): copying a {span}-token span after d tokens of text")
    vocabularies = (f"{taught} words", copy_symbols(text, vocab_size, taught)), ("every word", torch.arange(vocab_size))
    for words, symbols in vocabularies:
        rng = np.random.default_rng([seed, 2])
        for d in (0, 16, 64, train_len - 2 * span, 2 * train_len, 4 * train_len):
            with torch.no_grad():
                scores = measure(model, rng, symbols, text, span, d)
            print(f"  {words}, d={d}: accuracy {scores['accuracy']:.3f}, gain {scores['gain']:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoding", default="rope")
    parser.add_argument("--curriculum", choices=["warmup", "mixed", "lengths"], default="mixed")
    parser.add_argument("--model", choices=["task", "paper"], default="task", help="a conf/model preset")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--length", type=int, default=256, help="training sequence length (train_len)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--distances", type=int, nargs="+", default=[0, 16, 64, 160])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="measure this saved run instead of training (--span: its span)")
    parser.add_argument("--span", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(args.seed), torch.set_num_threads(1)
    if args.checkpoint:
        try:
            return measure_saved(args.checkpoint, args.span, args.seed)
        except PosbenchError as error:  # no such run, or not one posbench can load
            parser.error(str(error))
    conf = files("posbench") / "conf"
    corpus = load_corpus(DataConfig(**OmegaConf.to_container(OmegaConf.load(conf / "data" / "wikitext2_mini.yaml"))))
    text, symbols = corpus.splits["train"], copy_symbols(corpus.splits["train"], corpus.vocab_size, 128)
    preset = OmegaConf.load(conf / "model" / f"{args.model}.yaml")
    cfg = ModelConfig(**{**OmegaConf.to_container(preset), "dropout": 0.0})
    model = LanguageModel(cfg, {"name": args.encoding}, corpus.vocab_size, args.length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng, losses = np.random.default_rng([args.seed, 1]), []
    for step in range(1, args.steps + 1):
        x, y = batch(rng, symbols, text, args.curriculum, args.batch, args.length)
        loss = F.cross_entropy(model.head(model(x)).flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(), loss.backward(), optimizer.step()
        losses.append(loss.item())
        if step % 100 == 0:
            print(f"step {step}: loss {np.mean(losses[-100:]):.3f}", flush=True)
    model.eval()
    probe_rng = np.random.default_rng([args.seed, 2])
    span = min(SPAN, args.length // 4)
    print(f"{args.encoding} {args.model} {args.curriculum} at {args.length}, batch {args.batch}, {args.steps} steps:")
    print(f"copying a {span}-token span after d tokens of text: d, accuracy, gain (nats)")
    for d in args.distances:
        scores = measure(model, probe_rng, symbols, text, span, d)
        print(f"  d={d}: accuracy {scores['accuracy']:.3f}, gain {scores['gain']:.2f}")


if __name__ == "__main__":
    main()
