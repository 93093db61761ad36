"""How the LM head and loss chunk size moves the time and the page faults of one training batch.

    python scripts/loss_chunk_check.py                    # chunks 128 256 512 2048 4096, fp32 and bf16
    python scripts/loss_chunk_check.py 256 2048           # chosen chunks (positions)

The head and loss of ``LanguageModel.token_nll`` (a batch of 16 x 256 positions, d_model 256, the
33,278-word head), forward and backward, in fp32 and under bf16 autocast. The variants run
interleaved, each round once, so that a busy machine slows them alike; the table gives the median
seconds, the ratio to fp32 at 2,048 positions and the minor page faults of one step. ``--kept`` times
them inside ``runtime.freed_memory_kept()``, as ``train`` runs its steps.

``--fused`` adds, at each precision and chunk, a fused head and loss (the idea of Liger's and Cut
Cross-Entropy's kernels): forward keeps only each position's log-sum-exp, and backward recomputes the
chunk's logits to form the gradient, instead of keeping the fp32 logits and log-softmax for backward.
Its gradients are first checked against autograd's through ``F.cross_entropy``.
"""

import argparse
import contextlib
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from posbench.runtime import freed_memory_kept

POSITIONS, D_MODEL, VOCAB = 16 * 256, 256, 33278

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("chunks", nargs="*", type=int, default=[128, 256, 512, 2048, 4096])
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--kept", action="store_true", help="glibc keeps freed memory, as in `train`")
parser.add_argument("--fused", action="store_true", help="also time the recompute-in-backward head and loss")
args = parser.parse_args()

torch.manual_seed(0)
hidden, weight = torch.randn(POSITIONS, D_MODEL), torch.randn(VOCAB, D_MODEL) * 0.02
targets = torch.randint(0, VOCAB, (POSITIONS,))


def chunked_nll(h, w, chunk: int, precision: str):
    """token_nll's head and loss over ``chunk`` positions at a time."""
    nll = []
    for s in range(0, POSITIONS, chunk):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = F.linear(h[s : s + chunk], w)
        nll.append(F.cross_entropy(logits.float(), targets[s : s + chunk], reduction="none"))
    return torch.cat(nll)


class FusedHeadNLL(torch.autograd.Function):
    """Per-position NLL of ``targets`` under logits ``h @ wᵀ`` (in ``dtype``), chunk by chunk, logits not kept."""

    @staticmethod
    def forward(ctx, h, w, targets, chunk, dtype):
        lse, nll, w_low = [], [], w.to(dtype)
        for s in range(0, h.shape[0], chunk):
            logits = F.linear(h[s : s + chunk].to(dtype), w_low).float()
            lse.append(torch.logsumexp(logits, dim=1))
            nll.append(lse[-1] - logits.gather(1, targets[s : s + chunk, None]).squeeze(1))
        ctx.save_for_backward(h, w, targets, torch.cat(lse))
        ctx.chunk, ctx.dtype = chunk, dtype
        return torch.cat(nll)

    @staticmethod
    def backward(ctx, grad_nll):
        h, w, targets, lse = ctx.saved_tensors
        w_low, grad_h, grad_w = w.to(ctx.dtype), torch.empty_like(h), torch.zeros_like(w)
        for s in range(0, h.shape[0], ctx.chunk):
            rows = slice(s, s + ctx.chunk)
            h_low = h[rows].to(ctx.dtype)
            # d nll / d logits = softmax - onehot(target), times the incoming gradient
            grad = F.linear(h_low, w_low).float().sub_(lse[rows, None]).exp_()
            grad[torch.arange(grad.shape[0]), targets[rows]] -= 1
            grad = grad.mul_(grad_nll[rows, None]).to(ctx.dtype)
            grad_h[rows] = grad @ w_low
            grad_w += (grad.T @ h_low).float()
        return grad_h, grad_w, None, None, None


def fused_nll(h, w, chunk: int, precision: str):
    return FusedHeadNLL.apply(h, w, targets, chunk, torch.bfloat16 if precision == "bf16" else torch.float32)


def step(nll_fn, chunk: int, precision: str) -> tuple:
    """Forward and backward of the mean NLL; the gradients of the hidden states and the head."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    nll_fn(h, w, chunk, precision).mean().backward()
    return h.grad, w.grad


if args.fused:
    for a, b in zip(step(chunked_nll, 512, "fp32"), step(fused_nll, 512, "fp32")):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-9)

kinds = {"unfused": chunked_nll, **({"fused": fused_nll} if args.fused else {})}
variants = [(precision, chunk, kind) for kind in kinds for precision in ("fp32", "bf16") for chunk in args.chunks]
seconds = {v: [] for v in variants}
faults = {v: [] for v in variants}
with freed_memory_kept() if args.kept else contextlib.nullcontext():
    for v in variants:
        step(kinds[v[2]], v[1], v[0])  # warm-up
    for _ in range(args.rounds):
        for v in variants:
            before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            step(kinds[v[2]], v[1], v[0])
            seconds[v].append(time.perf_counter() - t0)
            faults[v].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
base = statistics.median(seconds.get(("fp32", 2048, "unfused"), seconds[variants[0]]))
print(f"{torch.get_num_threads()} threads, torch {torch.__version__}; ratio to fp32 at 2,048 (or the first row)")
print("| head and loss | precision | chunk (positions) | seconds | × fp32 at 2,048 | minor page faults |")
print("|---|---|---:|---:|---:|---:|")
for v in variants:
    median = statistics.median(seconds[v])
    faults_median = int(statistics.median(faults[v]))
    print(f"| {v[2]} | {v[0]} | {v[1]:,} | {median:.2f} | {base / median:.2f} | {faults_median:,} |")
