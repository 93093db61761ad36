#!/usr/bin/env bash
# The remedies' quick-preset measurements (docs/results.md, "What fixes extrapolation"): the quick preset at seed 0 for
# ENCODINGS, trained plain and with each training-side remedy (mixed lengths, randomized positions);
# the evaluation-time remedies (log-n scaling; attention temperature for none) on the plain runs; the
# context probe on every run; then one report.
#   scripts/remedies.sh [STEP...]     steps: plain lengths curriculum randomized evals report (default:
#                                     all). Runs are skipped when finished, resumed when killed.
# Settings from the environment: OUT (outputs/remedies), JOBS (2: runs at a time, one thread each, through
# hydra/launcher=joblib of the cluster extra), ENCODINGS (rope,sinusoidal,learned,none), TRAIN_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-outputs/remedies}
JOBS=${JOBS:-2}
ENCODINGS=${ENCODINGS:-rope,sinusoidal,learned,none}
read -r -a TRAIN_ARGS <<< "${TRAIN_ARGS:-}"
LAUNCH=()
(( JOBS == 1 )) || LAUNCH=(hydra/launcher=joblib "hydra.launcher.n_jobs=${JOBS}" threads=1)
# 1x..16x the training length on the test split (its first 16,384 tokens: the quick preset's cap)
COMMON=(experiment=quick seed=0 'eval.splits=[test]' 'probes=[context]')

sweep() {  # folder, overrides
    "$PYTHON" -m posbench -m train "encoding=${ENCODINGS}" "${COMMON[@]}" "${@:2}" "hydra.sweep.dir=${OUT}/$1" \
        "${LAUNCH[@]}" "${TRAIN_ARGS[@]}"
}

evals() {  # on each plain run: log-n scaling; for none also attention temperatures
    local run
    for run in "$OUT"/plain/*/; do
        "$PYTHON" -m posbench eval "checkpoint='${run}'" model.logn_scaling=true
        [[ "$run" != *encoding=none* ]] || "$PYTHON" -m posbench -m eval "checkpoint='${run}'" \
            eval.attn_temperature=1.25,1.5,2
    done
}

step() {
    echo "[remedies] $1"
    case "$1" in
        plain) sweep plain ;;
        lengths) sweep lengths 'train.lengths=[64,128,256]' train.length_order=random ;;
        curriculum) sweep curriculum 'train.lengths=[64,128,256]' train.length_order=curriculum ;;
        # M = 16x the training length: every evaluated position was seen in training
        randomized) sweep randomized encoding.randomized_positions=4096 ;;
        evals) evals ;;
        report) "$PYTHON" -m posbench report "$OUT" ;;
        *) echo "[remedies] unknown step $1" >&2; exit 2 ;;
    esac
}

steps=("$@")
(( ${#steps[@]} )) || steps=(plain lengths curriculum randomized evals report)
for s in "${steps[@]}"; do step "$s"; done
