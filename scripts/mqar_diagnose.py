"""What an mqar model has learned, read off its checkpoint: accuracy by the order the keys are asked in, and
where each layer's heads look.

    python scripts/mqar_diagnose.py RUN_DIR/checkpoint.pt [--distance 10] [--trials 256]

On sequences at train_len with the pairs ``--distance`` filler tokens before the queries:

* accuracy of each query in the order asked. A model that pairs keys with values scores the same at every
  place; one that only excludes the values already asked scores 1/pairs, 1/(pairs - 1), ... 1 (with
  ``task.queries == task.pairs``), the floor that docs/tasks.md describes.
* per layer and head, the attention weight of each source value on the key just before it (the
  previous-token head an induction circuit needs in the first layer) and of each query key on the value
  that answers it and on all the source's values (what the second layer must read).

The model runs in fp32 on the CPU; the weights are softmax(q·kᵀ/√d + the encoding's bias), causal, taken
from the queries and keys each layer computes (``Attention.observer``).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
from omegaconf import OmegaConf

from posbench.masks import causal_mask
from posbench.model import LanguageModel
from posbench.tasks import build_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--distance", type=int, default=10)
    parser.add_argument("--trials", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        payload = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:  # no such file, or not a checkpoint (torch.load raises many kinds)
        parser.error(f"{args.checkpoint}: {str(error).splitlines()[0]}")
    cfg = OmegaConf.create(payload["config"])
    task = build_task(cfg.task)
    if task.cfg.name != "mqar":
        raise SystemExit(f"mqar_diagnose: {args.checkpoint} is a task={task.cfg.name} run, not mqar")
    model = LanguageModel(cfg.model, cfg.encoding, len(payload["vocab"]), cfg.train_len)
    model.load_state_dict(payload["model"])
    model.eval()
    length, pairs, queries = cfg.train_len, task.cfg.pairs, task.cfg.queries
    batch = task.sequences(np.random.default_rng([0x7A54, args.distance]), length, np.full(args.trials, args.distance))
    caught = []
    model.attention.observer = lambda q, k: caught.append((q, k))
    with torch.no_grad():
        logits = model.head(model(batch.x))
    asked = batch.answer.nonzero().flatten()  # the query keys' positions (their targets are the answers)
    hits = (logits[:, asked].argmax(-1) == batch.y[:, asked]).double()
    print(
        f"{cfg.encoding.name}, {pairs} pairs, {queries} queries, distance {args.distance}: accuracy (whole "
        f"answer) {hits.all(1).double().mean():.3f}"
    )
    print("  by query, in the order asked:", " ".join(f"{a:.2f}" for a in hits.mean(0).tolist()))
    if not task.cfg.repeat_keys:
        print(
            "  excluding the values already asked would give (distinct values):",
            " ".join(f"{1 / (pairs - i):.2f}" for i in range(queries)),
        )

    x = batch.x.numpy()
    source_start = length + 1 - 2 * queries - args.distance - 2 * pairs
    values = source_start + 1 + 2 * np.arange(pairs)  # the source's value positions
    # the source value that answers each query: the token after the key's only earlier occurrence
    answers = np.array([[np.flatnonzero(row[:p] == row[p])[0] + 1 for p in asked.tolist()] for row in x])
    idx = torch.arange(length)
    mask = causal_mask(model.encoding, idx, idx)  # (1, H|1, T, T)
    rows = torch.arange(len(x))[:, None]
    for layer, (q, k) in enumerate(caught):
        weights = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask).softmax(-1)  # (B, H, T, T)
        on_key = weights[:, :, values, values - 1].mean((0, 2))
        at_query = weights[:, :, asked]  # (B, H, queries, T)
        on_answer = at_query.permute(0, 2, 1, 3)[rows, torch.arange(queries), :, torch.from_numpy(answers)].mean((0, 1))
        on_values = at_query[..., values].sum(-1).mean((0, 2))
        show = lambda t: " ".join(f"{w:.2f}" for w in t.tolist())  # noqa: E731
        print(f"layer {layer}, by head:")
        print(f"  source value on the key before it:  {show(on_key)}")
        print(f"  query key on the value it asks for: {show(on_answer)}")
        print(f"  query key on all the source values: {show(on_values)}")


if __name__ == "__main__":
    main()
