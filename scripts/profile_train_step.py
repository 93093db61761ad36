"""Where a training step of the paper model spends its time: torch.profiler over one step of ``bench``.

    python scripts/profile_train_step.py                      # rope, model.attention=sdpa, the paper's dropout
    python scripts/profile_train_step.py alibi eager 0.0      # encoding, backend, attention dropout
    python scripts/profile_train_step.py rope sdpa 0.0 --precision bf16

Batch 16 x 256, vocabulary 33,278, AdamW: the step ``posbench bench`` times. Prints the operators
with the most self time, then the share of the step spent in the LM head and loss (the forward and
backward matmuls with the 33,278-word head, log-softmax, cross-entropy, the tied embedding)
versus everything else.
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from posbench.bench import BenchConfig, train_step_fn
from posbench.model import LanguageModel, ModelConfig
from posbench.positional import ENCODINGS
from posbench.runtime import freed_memory_kept

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("encoding", nargs="?", default="rope", choices=list(ENCODINGS))
parser.add_argument("backend", nargs="?", default="sdpa", choices=["eager", "sdpa", "flex", "auto"])
parser.add_argument("attn_dropout", nargs="?", type=float, default=None, help="default: the paper model's dropout")
parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (the heap settles in 2-3)")
args = parser.parse_args()
encoding, backend = args.encoding, args.backend
cfg = BenchConfig(model=ModelConfig(attention=backend, attn_dropout=args.attn_dropout))
torch.manual_seed(0)
model = LanguageModel(cfg.model, ENCODINGS[encoding][0](), cfg.vocab_size, cfg.train_len, args.precision)
step = train_step_fn(model, lambda x, y: model.token_nll(x, y).mean(), cfg, torch.device("cpu"))
with freed_memory_kept():  # as `train` and `bench` run their steps
    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    seconds = time.perf_counter() - t0
print(
    f"{encoding}/{backend}, {args.precision}, attention dropout {model.attn_dropout}, "
    f"{torch.get_num_threads()} threads: one step {seconds:.2f} s (profiled), "
    f"{cfg.train_batch * cfg.train_len / seconds:,.0f} tok/s"
)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))

# Only the tied embedding/head and the loss have the vocabulary as a dimension.
events = [e for e in prof.key_averages(group_by_input_shape=True) if e.self_cpu_time_total > 0]
head_ops = ("log_softmax", "nll_loss", "cross_entropy")
head = sum(
    e.self_cpu_time_total
    for e in events
    if any(cfg.vocab_size in shape for shape in e.input_shapes if isinstance(shape, list))
    or any(op in e.key for op in head_ops)
)
total = sum(e.self_cpu_time_total for e in events)
print(
    f"embedding, LM head and loss (ops on the {cfg.vocab_size:,}-word vocabulary): "
    f"{100 * head / total:.0f}% of operator self time"
)
