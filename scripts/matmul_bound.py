"""How close to the matmul peak can a training step of the bench model get, if it did nothing but matmuls?

    python scripts/matmul_bound.py            # bf16 and fp32, 5 repeats of each product

Times, in each precision, every matrix product of one training step of ``posbench bench``'s model
(batch 16 x 256, d_model 256, FFN 512, 6 layers, vocabulary 33,278, the LM head in chunks of
``model.loss_chunk`` rows) at its own shape: each weight's forward product and its two backward
products (input gradient, weight gradient), and the attention products (q·kᵀ and p·v, per head, and
their backward). Their summed FLOPs over their summed time is the best FLOP rate a step made only of
these products could reach; it is printed as a share of the 2,048³ peak that ``bench`` measures
(``matmul_peak_flops``), the yardstick of ``bench``'s ``% of peak``. A target above that share cannot
be met by removing overheads; only fusing products or growing them could.
"""

import argparse

import torch

from posbench.bench import BenchConfig
from posbench.bench.timing import DTYPES, matmul_peak_flops, median_seconds

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--repeats", type=int, default=5)
args = parser.parse_args()

cfg = BenchConfig()
m = cfg.model
rows = cfg.train_batch * cfg.train_len
head_rows = m.loss_chunk // cfg.train_batch * cfg.train_batch  # the chunk of positions, all batch rows
weights = {  # name: (rows, in, out, times per step)
    "qkv": (rows, m.d_model, 3 * m.d_model, m.n_layers),
    "proj": (rows, m.d_model, m.d_model, m.n_layers),
    "ffn in": (rows, m.d_model, m.d_ff, m.n_layers),
    "ffn out": (rows, m.d_ff, m.d_model, m.n_layers),
    "head": (head_rows, m.d_model, cfg.vocab_size, rows // head_rows),
}
heads, head_dim, seq = cfg.train_batch * m.n_heads, m.d_model // m.n_heads, cfg.train_len


def products(n: int, k: int, o: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The forward product x·W and its backward: dY·Wᵀ (input gradient) and xᵀ·dY (weight gradient)."""
    return [((n, k), (k, o)), ((n, o), (o, k)), ((k, n), (n, o))]


def attention_products() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """q·kᵀ and p·v per (batch, head), each with its two backward products (full, not causal-halved)."""
    qk = [((heads, seq, head_dim), (heads, head_dim, seq))]
    pv = [((heads, seq, seq), (heads, seq, head_dim))]
    backward = [((heads, seq, seq), (heads, seq, head_dim)), ((heads, head_dim, seq), (heads, seq, seq))]
    return qk + pv + 2 * backward


def timed(shapes, dtype) -> tuple[float, float]:
    """(FLOPs, seconds) of one product of these operand shapes."""
    a, b = torch.randn(*shapes[0], dtype=dtype), torch.randn(*shapes[1], dtype=dtype)
    flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
    return flops, median_seconds(lambda: a @ b, args.repeats, warmup=2)


print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
for precision in ("bf16", "fp32"):
    dtype = DTYPES[precision]
    peak = matmul_peak_flops(torch.device("cpu"), precision)
    total_flops = total_seconds = 0.0
    for name, (n, k, o, times) in weights.items():
        flops, seconds = map(sum, zip(*(timed(s, dtype) for s in products(n, k, o))))
        total_flops, total_seconds = total_flops + times * flops, total_seconds + times * seconds
        rate = flops / seconds
        print(f"{precision} {name:8} {n}x{k}x{o}: {rate / 1e9:7.1f} GFLOP/s ({rate / peak:.0%} of peak)")
    flops, seconds = map(sum, zip(*(timed(s, dtype) for s in attention_products())))
    # causal attention needs half of these FLOPs, and flash kernels skip the masked half
    total_flops, total_seconds = total_flops + m.n_layers * flops / 2, total_seconds + m.n_layers * seconds / 2
    rate = flops / seconds
    print(f"{precision} attention {heads}x{seq}x{head_dim}: {rate / 1e9:7.1f} GFLOP/s ({rate / peak:.0%} of peak)")
    print(
        f"{precision}: peak (2048^3) {peak / 1e9:.1f} GFLOP/s; a step of these products alone: "
        f"{total_flops / total_seconds / 1e9:.1f} GFLOP/s = {total_flops / total_seconds / peak:.0%} of peak, "
        f"{total_seconds * 1e3:.0f} ms for {rows:,} tokens = at most {rows / total_seconds:,.0f} tok/s"
    )
