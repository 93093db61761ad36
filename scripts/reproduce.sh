#!/usr/bin/env bash
# The extrapolation study of docs/results.md, end to end:
#   1. train every encoding x 3 seeds with experiment=study (the quick preset, evaluated
#      non-overlapping on the first 16,384 test tokens at 256..8192 = 1x..32x train_len);
#   2. evaluate every run again with sliding windows (stride $STRIDE);
#   3. evaluate every RoPE run with linear / NTK / YaRN context extension x4 and x16;
#   4. python -m posbench report.
#
# Usage:  scripts/reproduce.sh [DATA_DIR]        (default ../shared/data/wikitext-2-mini)
# Settings, all overridable from the environment:
#   OUT        outputs/study           where the runs and OUT/report go
#   ENCODINGS  alibi,rope,sinusoidal,learned,none
#   SEEDS      0,1,2
#   EXPERIMENT study
#   STRIDE     1024                    sliding-window stride (tokens; see the budget below)
#   SCALINGS   linear,ntk,yarn         RoPE context extensions, each at FACTORS
#   FACTORS    4,16
#   TRAIN_ARGS ""                      extra train overrides, e.g. "train.steps=2" for a dry run
#   EVAL_ARGS  ""                      extra eval overrides for steps 2 and 3
# A dry run in seconds: EXPERIMENT=smoke SEEDS=0 ENCODINGS=rope,alibi STRIDE=16 FACTORS=4 \
#   TRAIN_ARGS="train.steps=2 eval_lens=[32,64]" OUT=/tmp/study scripts/reproduce.sh
#
# Time budget on 2 CPU cores (< 2.5 h = 150 min). Measured: the quick preset takes ~7 min per
# run (training + non-overlapping eval of valid and test at 256..4096; the lead's figure on
# this machine). Per-length eval times of 16,384 tokens (ALiBi, quick, from the train.log of
# `python -m posbench -m train encoding=alibi,... experiment=quick`, 2026-11-29, while other jobs
# shared the cores: training took 11 min there, so these are ~1.5x too slow):
#   256: 4.0 s, 512: 4.6 s, 1024: 5.8 s, 2048: 7.1 s, 4096: 12.9 s  ->  ~3.4 s + 2.3 ms x L,
#   so 8192: ~22 s.
# Sliding windows of L advancing by S over N = 16,384 tokens run ~(N - L)/S + 1 windows, i.e.
# that many times L/N the non-overlapping cost at L. At S = 1024: 9 x 8192, 13 x 4096,
# 15 x 2048 tokens (L <= 1024: stride = L, the non-overlapping windows) ->
#   4.5 x 22 + 3.25 x 12.9 + 1.9 x 7.1 + 5.8 + 4.6 + 4.0 = ~170 s loaded, ~110 s on free cores.
# At S = 512 it is ~315 s loaded (S = 128: ~4x that): over budget with 15 runs.
#   1. 5 encodings x 3 seeds = 15 runs x ~7 min, less the valid-split eval it skips
#      (~0.6 min), plus 8192 (~0.25 min)                                       ~100 min
#   2. sliding, S = 1024: 15 runs x ~2 min                                          ~30 min
#   3. 3 RoPE runs x 6 scalings, non-overlapping test at 6 lengths (~40 s each)    ~12 min
#   4. report                                                                       < 1 min
#                                                                        total    ~143 min
# More encodings (t5, kerple_log, kerple_power, fire, xpos) add ~9 min each per seed:
# with all ten at 3 seeds the study takes ~4.5 h; pass ENCODINGS to choose.
set -euo pipefail

DATA=$(realpath "${1:-${DATA:-../shared/data/wikitext-2-mini}}")
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-outputs/study}
ENCODINGS=${ENCODINGS:-alibi,rope,sinusoidal,learned,none}
SEEDS=${SEEDS:-0,1,2}
EXPERIMENT=${EXPERIMENT:-study}
STRIDE=${STRIDE:-1024}
SCALINGS=${SCALINGS:-linear,ntk,yarn}
FACTORS=${FACTORS:-4,16}
read -r -a TRAIN_ARGS <<< "${TRAIN_ARGS:-}"
read -r -a EVAL_ARGS <<< "${EVAL_ARGS:-}"

start=$(date +%s)
stamp() { echo "[reproduce] $(( ($(date +%s) - start) / 60 )) min: $*"; }

stamp "training ${ENCODINGS} x seeds ${SEEDS} (experiment=${EXPERIMENT}) into ${OUT}"
"$PYTHON" -m posbench -m train "encoding=${ENCODINGS}" "seed=${SEEDS}" "experiment=${EXPERIMENT}" \
    "data.path=${DATA}" "hydra.sweep.dir=${OUT}" "${TRAIN_ARGS[@]}"

runs=()
for checkpoint in "$OUT"/*/checkpoint.pt; do runs+=("$(dirname "$checkpoint")"); done

for run in "${runs[@]}"; do
    stamp "sliding windows, stride ${STRIDE}: ${run}"
    "$PYTHON" -m posbench eval "checkpoint='${run}'" eval.mode=sliding "eval.stride=${STRIDE}" "${EVAL_ARGS[@]}"
done

for run in "${runs[@]}"; do
    grep -q '^rope,' "$run/results.csv" || continue
    stamp "RoPE scaling ${SCALINGS} x ${FACTORS}: ${run}"
    "$PYTHON" -m posbench -m eval "checkpoint='${run}'" "rope.scaling.type=${SCALINGS}" "rope.scaling.factor=${FACTORS}" \
        "${EVAL_ARGS[@]}"
done

"$PYTHON" -m posbench report "$OUT"
stamp "done; wall time $(( $(date +%s) - start )) s"
