#!/usr/bin/env bash
# Training speed of two commits, measured alternately so that a shared machine slows both alike.
#
# Usage:  scripts/bench_commits.sh OLD NEW [bench overrides...]
#         scripts/bench_commits.sh 560223d e2a4a76 'encodings=[rope,none]' 'backends=[eager,sdpa]'
#
# Each round runs `posbench bench` (training rows only, fp32 and bf16) from a throwaway worktree of
# OLD, then of NEW; ROUNDS (default 2) rounds. Prints every training row with its commit and round, then
# the median tokens/s per commit, encoding, backend and precision. Needs the package's dependencies
# installed (the current environment's python runs both commits' source).
set -euo pipefail
(( $# >= 2 )) || { echo "usage: $0 OLD NEW [bench overrides...]" >&2; exit 2; }
old=$1 new=$2
shift 2
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-2}
work=$(mktemp -d)
trap 'git worktree remove --force "$work/old" 2>/dev/null; git worktree remove --force "$work/new" 2>/dev/null; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/old" "$old"
git worktree add -q --detach "$work/new" "$new"
for (( round = 1; round <= ROUNDS; round++ )); do
    for side in old new; do
        PYTHONPATH="$work/$side/src" "$PYTHON" -m posbench bench 'precisions=[fp32,bf16]' 'eval_lens=[]' \
            xtransformers=false "$@" "hydra.run.dir=$work/runs/$side.$round" > "$work/$side.$round.log" 2>&1 \
            || { tail -n 5 "$work/$side.$round.log" >&2; exit 1; }
    done
done
"$PYTHON" - "$work/runs" "$old" "$new" <<'PY'
import sys
from pathlib import Path

import pandas as pd

from posbench.markdown import markdown_table

runs, names = Path(sys.argv[1]), {"old": sys.argv[2], "new": sys.argv[3]}
tables = []
for csv in sorted(runs.glob("*/bench.csv")):
    side, round_ = csv.parent.name.split(".")
    table = pd.read_csv(csv)
    tables.append(table[table.phase == "train"].assign(commit=names[side], round=int(round_)))
table = pd.concat(tables)
key = ["encoding", "backend", "precision"]
rows = [[*r[:-1], f"{r[-1]:,.0f}"] for r in table[["commit", "round", *key, "tokens_per_s"]].values]
print(markdown_table(["commit", "round", *key, "tok/s"], rows, right={"tok/s"}))
median = table.pivot_table(index=key, columns="commit", values="tokens_per_s", aggfunc="median")
rows = [[*k, f"{r[names['old']]:,.0f}", f"{r[names['new']]:,.0f}"] for k, r in median.iterrows()]
print(f"\nmedian tok/s over {table['round'].max()} rounds")
print(markdown_table([*key, names["old"], names["new"]], rows, right=set(names.values())))
PY
