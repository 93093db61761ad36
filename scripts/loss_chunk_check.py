"""How the LM head and loss chunk size moves the time and the page faults of one training batch.

    python scripts/loss_chunk_check.py                    # chunks 128 256 512 2048 4096, fp32 and bf16
    python scripts/loss_chunk_check.py 256 2048           # chosen chunks (positions)

The head and loss of ``LanguageModel.token_nll`` (a batch of 16 x 256 positions, d_model 256, the
33,278-word head), forward and backward, in fp32 and under bf16 autocast. The variants run
interleaved, each round once, so that a busy machine slows them alike; the table gives the median
seconds, the ratio to fp32 at 2,048 positions and the minor page faults of one step.
"""

import argparse
import resource
import statistics
import time

import torch
import torch.nn.functional as F

POSITIONS, D_MODEL, VOCAB = 16 * 256, 256, 33278

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("chunks", nargs="*", type=int, default=[128, 256, 512, 2048, 4096])
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
hidden, weight = torch.randn(POSITIONS, D_MODEL), torch.randn(VOCAB, D_MODEL) * 0.02
targets = torch.randint(0, VOCAB, (POSITIONS,))


def step(chunk: int, precision: str) -> None:
    """token_nll's head and loss over ``chunk`` positions at a time, then backward."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    nll = []
    for s in range(0, POSITIONS, chunk):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = F.linear(h[s : s + chunk], w)
        nll.append(F.cross_entropy(logits.float(), targets[s : s + chunk], reduction="none"))
    torch.cat(nll).mean().backward()


variants = [(precision, chunk) for precision in ("fp32", "bf16") for chunk in args.chunks]
seconds = {v: [] for v in variants}
faults = {v: [] for v in variants}
for v in variants:
    step(v[1], v[0])  # warm-up
for _ in range(args.rounds):
    for v in variants:
        before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        step(v[1], v[0])
        seconds[v].append(time.perf_counter() - t0)
        faults[v].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
base = statistics.median(seconds.get(("fp32", 2048), seconds[variants[0]]))
print(f"{torch.get_num_threads()} threads, torch {torch.__version__}; ratio to fp32 at 2,048 (or the first row)")
print("| precision | chunk (positions) | seconds | × fp32 at 2,048 | minor page faults |")
print("|---|---:|---:|---:|---:|")
for v in variants:
    median = statistics.median(seconds[v])
    print(f"| {v[0]} | {v[1]:,} | {median:.2f} | {base / median:.2f} | {int(statistics.median(faults[v])):,} |")
