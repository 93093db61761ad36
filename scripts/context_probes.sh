#!/usr/bin/env bash
# docs/results.md, "Does it use the context?": six encodings trained with experiment=study at seed 0,
# the four probes on each run (the study preset runs them after training; `posbench probe
# checkpoint=RUN` does the same on a run trained without them), then the report.
#
# Usage:  scripts/context_probes.sh
# Settings, overridable from the environment:
#   OUT        outputs/context_probes                 where the runs and OUT/report go
#   ENCODINGS  alibi,rope,sinusoidal,none,kerple_log,t5
#   PRECISION  fp32        the published runs trained in fp32 (auto would pick bf16 on a CPU with native bf16)
#   JOBS       2           runs at a time, one torch thread each (hydra/launcher=joblib, the cluster extra)
# Time on 2 CPU cores (2026-11-30, the published run, sharing the cores with other work): training
# about 10 min per pair of runs; the probes 15-25 min per run, most of it the context and copy probes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-outputs/context_probes}
ENCODINGS=${ENCODINGS:-alibi,rope,sinusoidal,none,kerple_log,t5}
PRECISION=${PRECISION:-fp32}
JOBS=${JOBS:-2}
LAUNCH=()
[[ "$JOBS" == 1 ]] || LAUNCH=(hydra/launcher=joblib "hydra.launcher.n_jobs=$JOBS" threads=1)
"$PYTHON" -m posbench -m train experiment=study "encoding=$ENCODINGS" seed=0 "precision=$PRECISION" \
    "${LAUNCH[@]}" "hydra.sweep.dir=$OUT"
"$PYTHON" -m posbench report "$OUT"
