"""Peak resident memory of one evaluation pass over long sequences, each encoding in a fresh process.

    python scripts/eval_peak_rss.py --length 16384 cope dape fox stickbreaking
    python scripts/eval_peak_rss.py --length 2048 --batch 8 cope   # as eval batches 16,384 tokens

The paper model (6 layers, d_model 256, 8 heads) with random weights, bf16 autocast, ``attention=auto``,
one thread, vocabulary of the shipped WikiText-2 slice; prints seconds and the whole process's peak RSS
(docs/performance.md, "Evaluation: backends and memory").
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import torch

from posbench.model import LanguageModel, ModelConfig
from posbench.positional import ENCODINGS

VOCAB = 12882  # wikitext-2-mini's


def measure(name: str, length: int, batch: int) -> str:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(attention="auto", dropout=0.0)
    model = LanguageModel(cfg, ENCODINGS[name][0](), VOCAB, train_len=256, precision="bf16").eval()
    tokens = torch.randint(0, VOCAB, (batch, length + 1))
    start = time.perf_counter()
    with torch.no_grad():
        model.token_nll(tokens[:, :-1], tokens[:, 1:])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    took = time.perf_counter() - start
    return f"{name:>14} at {batch} x {length}: {took:6.1f} s, peak RSS {peak:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("encodings", nargs="+", choices=sorted(ENCODINGS))
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=1, help="sequences in the pass")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # one encoding, here
    args = parser.parse_args()
    if args.in_process:
        print(measure(args.encodings[0], args.length, args.batch), flush=True)
        return
    for name in args.encodings:  # ru_maxrss is per process: a fresh one for each
        options = ["--length", str(args.length), "--batch", str(args.batch), "--in-process"]
        subprocess.run([sys.executable, __file__, name, *options], check=True)


if __name__ == "__main__":
    main()
