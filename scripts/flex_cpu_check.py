"""Is compiled FlexAttention right on this machine? ALiBi-biased causal attention, flex vs SDPA.

    python scripts/flex_cpu_check.py                # lengths 40, 300, 128, 1000, 40
    python scripts/flex_cpu_check.py 40,100,40

Prints the largest error against SDPA with the same bias as a dense mask, per length, for the
sequences as they are and zero-padded to whole 128-token blocks (what posbench does). On torch
2.13 CPU, 40 tokens (less than one block) gave NaN as they are the first time, and matched SDPA to
5e-7 padded; the failure depends on what ran before, so run it in a fresh process.
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

HEADS, HEAD_DIM, BLOCK = 4, 16, 128
SLOPES = torch.tensor([2.0 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)])


def alibi(score, batch, head, q_idx, kv_idx):
    return score - SLOPES[head] * (q_idx - kv_idx)


def causal(batch, head, q_idx, kv_idx):
    return q_idx >= kv_idx


def check(padded: bool, lengths: list[int]) -> None:
    torch._dynamo.reset()
    kernel = torch.compile(flex_attention, dynamic=False)
    for seq_len in lengths:
        torch.manual_seed(seq_len)
        q, k, v = (torch.randn(2, HEADS, seq_len, HEAD_DIM) for _ in range(3))
        pos = torch.arange(seq_len)
        bias = -SLOPES[:, None, None] * (pos[:, None] - pos[None, :])
        reference = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.masked_fill(pos[:, None] < pos[None, :], float("-inf"))
        )
        total = -(-seq_len // BLOCK) * BLOCK if padded else seq_len
        q, k, v = (F.pad(t, (0, 0, 0, total - seq_len)) for t in (q, k, v))
        start = time.perf_counter()
        block_mask = create_block_mask(causal, None, None, total, total, device="cpu")
        out = kernel(q, k, v, score_mod=alibi, block_mask=block_mask)[:, :, :seq_len]
        error = (out - reference).abs().max().item()
        seconds = time.perf_counter() - start
        label = "padded" if padded else "as is"
        print(f"{label:6} length {seq_len:5}: max |flex - sdpa| {error:.1e} ({seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    lengths = [int(n) for n in sys.argv[1].split(",")] if len(sys.argv) > 1 else [40, 300, 128, 1000, 40]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for padded in (False, True):
        check(padded, lengths)
