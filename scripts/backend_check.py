"""Eager against sdpa attention for training on CPU, by precision and training length.

    python scripts/backend_check.py                          # rope, none, alibi at 256, 512, 1,024
    python scripts/backend_check.py --encodings rope --lengths 256 --rounds 5

One optimizer step of ``posbench bench``'s model (16 x 256 tokens per batch: 16 * 256 / T sequences
of T tokens, attention dropout 0 as ``experiment=study`` trains) with each backend, in fp32 and bf16.
The variants of one encoding and length run interleaved, each round once, so that a busy machine slows
them alike; the table gives median seconds and eager's speed-up over sdpa at the same precision. This
is the measurement behind ``attention.EAGER_AUTO_MAX_TRAIN_LEN`` (what ``auto`` trains with).
"""

import argparse
import itertools
import statistics
import time

import torch

from posbench.bench import BenchConfig, train_step_fn
from posbench.model import LanguageModel, ModelConfig
from posbench.positional import ENCODINGS
from posbench.runtime import freed_memory_kept

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--encodings", nargs="+", default=["rope", "none", "alibi"], choices=list(ENCODINGS))
parser.add_argument("--lengths", nargs="+", type=int, default=[256, 512, 1024])
parser.add_argument("--rounds", type=int, default=4)
args = parser.parse_args()

VARIANTS = list(itertools.product(("fp32", "bf16"), ("sdpa", "eager")))


def step_of(encoding: str, length: int, precision: str, backend: str):
    """A timed-step closure for one variant, from the same initialisation as the others."""
    model_cfg = ModelConfig(attention=backend, attn_dropout=0.0)
    cfg = BenchConfig(model=model_cfg, train_len=length, train_batch=max(1, 16 * 256 // length))
    torch.manual_seed(0)
    model = LanguageModel(model_cfg, ENCODINGS[encoding][0](), cfg.vocab_size, length, precision)
    return train_step_fn(model, lambda x, y: model.token_nll(x, y).mean(), cfg, torch.device("cpu"))


def medians(encoding: str, length: int) -> dict:
    steps = {v: step_of(encoding, length, *v) for v in VARIANTS}
    seconds = {v: [] for v in VARIANTS}
    for step in steps.values():  # warm-up: the heap settles in 2 steps
        step(), step()
    for _ in range(args.rounds):
        for v, step in steps.items():
            t0 = time.perf_counter()
            step()
            seconds[v].append(time.perf_counter() - t0)
    return {v: statistics.median(s) for v, s in seconds.items()}


print(f"{torch.get_num_threads()} threads, torch {torch.__version__}, {args.rounds} rounds")
print("| encoding | train_len | precision | sdpa s/step | eager s/step | eager speed-up |")
print("|---|---:|---|---:|---:|---:|")
with freed_memory_kept():  # as `train` runs its steps
    for encoding, length in itertools.product(args.encodings, args.lengths):
        median = medians(encoding, length)
        for precision in ("fp32", "bf16"):
            sdpa, eager = median[(precision, "sdpa")], median[(precision, "eager")]
            print(f"| {encoding} | {length:,} | {precision} | {sdpa:.3f} | {eager:.3f} | {sdpa / eager:.2f}× |")
