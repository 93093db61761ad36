#!/usr/bin/env bash
# The bf16 quality check (docs/performance.md, "Does bf16 cost quality?"): the quick preset trained in fp32
# and in bf16 for alibi, rope and sinusoidal at seeds 0, 1, 2, test perplexity at 256 and 16x (4,096),
# then the report (precision is part of a run's identity there, so each encoding gets a line per precision).
# Settings from the environment: OUT (outputs/precision_check), JOBS (2 runs at a time, one thread each,
# through hydra/launcher=joblib of the cluster extra).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-outputs/precision_check}
JOBS=${JOBS:-2}
"$PYTHON" -m posbench -m train encoding=alibi,rope,sinusoidal seed=0,1,2 precision=fp32,bf16 experiment=quick \
    hydra/launcher=joblib "hydra.launcher.n_jobs=${JOBS}" threads=1 'eval_lens=[256,4096]' "hydra.sweep.dir=${OUT}"
"$PYTHON" -m posbench report "$OUT"
