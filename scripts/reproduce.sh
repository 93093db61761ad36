#!/usr/bin/env bash
# The study of docs/results.md, in resumable stages.
#
# Usage:  scripts/reproduce.sh [STAGE...]        every stage in order when none is named
#         scripts/reproduce.sh list              the stages and their runs
#         QUICK=1 scripts/reproduce.sh           the five seed encodings at seed 0, quick preset, then report
#
# Stages (each a list of runs; a run is trained, evaluated and probed by `posbench train`):
#   seed0 seed1 seed2   every encoding of conf/encoding at that seed, experiment=study, with the validation
#                       loss also logged at $VAL_LENS (train.val_lens: it changes no number of the run)
#   remedies            rope, sinusoidal, learned, none at seed 0 with each training-side remedy:
#                       mixed lengths (random and curriculum order) and randomized positions (not for
#                       none: it has no positions to randomize, so that run would be the plain one again)
#   lengths             alibi, rope, none, sinusoidal at train_len 64, 128 and 512 (seed 0; 256 is seed0's),
#                       evaluated out to 32x, capped at 16,384, with tokens per step kept at 4 x 256
#   learned_table       learned positions at seeds 0, 1 and 2 as in seed0 but with a table of 16 x train_len
#                       (encoding.max_positions=4096; the rows past train_len are never trained), so that
#                       generation can go past train_len as the source document's learned model did
#   tasks0 tasks1 tasks2  the task track (docs/tasks.md) at that seed: every encoding on passkey, mqar and
#                       copy (task=NAME brings its recipe), each run writing task_results.csv
#   copylm0             every encoding at seed 0 as a copy-trained LM (experiment=copy_lm, docs/tasks.md): a warm-up
#                       on copies alone, then text with copies; perplexity to 32x, the probes, the copy probe to 32x
#   copylm_seeds        alibi, rope, none and fire as in copylm0, at seeds 1 and 2
#   task_remedies       rope, sinusoidal, learned on passkey and copy at seed 0, trained with randomized
#                       positions up to the longest eval length (Ruoss et al. 2023's remedy, made for such tasks)
#   evals               on finished runs: sliding windows (stride $STRIDE, the first $SLIDING_TOKENS
#                       test tokens), RoPE context extension
#                       (linear, NTK, YaRN at x4 and x16), log-n scaling and attention temperature on
#                       seed 0's rope, sinusoidal, learned and none, blockwise attention on xPos
#   task_evals          on finished tasks0 runs that learned their task: RoPE context extension (linear, NTK,
#                       YaRN at x4 and x32) on rope, log-n scaling and attention temperature on $TASK_VARIANT_ENCODINGS
#   generate            on finished seed and learned_table runs: posbench generate, $PROMPTS test prompts continued to 16x
#                       train_len (samples.jsonl, generation.csv), skipped once done like the evals
#   report              python -m posbench report on each stage folder, and on the whole study with paired
#                       comparisons against $COMPARE (default alibi)
#   archive             (named only) copies each finished run's CSVs, logs and configs, not its checkpoints,
#                       to $ARCHIVE/<stage>/<run name>: the measurements behind docs/results.md, small
#                       enough to keep in git, from which `report` redraws every table and figure
# A stage name may name one part of its group: seed0.2 is seed0's runs 5..8 (PART runs a part), sized so
# that a part finishes in one sitting on 2 CPU cores; `list` shows the parts.
#
# Resumable: a finished run is skipped, a killed one continues from its last.pt (train.resume=auto);
# the evals stage skips each evaluation it finished before (marked in <run>/evals_done/) and redoes the
# one it was killed in. Run folders: $OUT/<stage>/<run name>.
#
# Settings, from the environment:
#   OUT        outputs/study    where the runs and the reports go
#   PART       4                runs per part of a stage
#   KEEP_GOING 0                1: a failed run does not stop the later stages (the script still exits 1)
#   JOBS       2                runs at a time (threads=1 each on a CPU); on one GPU, more (e.g. 14)
#   DEVICE     auto             passed as device= to every command
#   STRIDE     256              sliding-window stride of the evals stage (tokens)
#   SLIDING_TOKENS 32768        test tokens scored by the sliding evaluation (null: the whole split)
#   VAL_LENS   [256,1024,4096]  the seed runs' train.val_lens
#   PROMPTS    32               prompts of the generate stage
#   TRAIN_ARGS ""               extra train overrides, e.g. "train.steps=2 probes=[]" for a dry run
#   EVAL_ARGS  ""               extra eval overrides
#   DATA       (the shipped slice)   a WikiText-2 folder, passed as data.path
#   ARCHIVE    docs/results/runs     where the archive stage copies to
#
# Compute: docs/results.md states what each stage took and on which machine (with each stage's results).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-outputs/study}
JOBS=${JOBS:-2}
DEVICE=${DEVICE:-auto}
STRIDE=${STRIDE:-256}
SLIDING_TOKENS=${SLIDING_TOKENS:-32768}
VAL_LENS=${VAL_LENS:-[256,1024,4096]}
PROMPTS=${PROMPTS:-32}
QUICK=${QUICK:-0}
PART=${PART:-4}
KEEP_GOING=${KEEP_GOING:-0}
COMPARE=${COMPARE:-alibi}
ARCHIVE=$(realpath -m "${ARCHIVE:-docs/results/runs}")
read -r -a TRAIN_ARGS <<< "${TRAIN_ARGS:-}"
read -r -a EVAL_ARGS <<< "${EVAL_ARGS:-}"
COMMON=("device=${DEVICE}")
[[ -z "${DATA:-}" ]] || COMMON+=("data.path=$(realpath "$DATA")")
# one thread a process when several share the CPU; kept out of COMMON, whose arguments an eval or generate
# mark records, as it changes no number
THREADS=()
[[ "$DEVICE" == cuda* ]] || (( JOBS == 1 )) || THREADS=(threads=1)
ENCODINGS=$(for file in conf/encoding/*.yaml; do basename "$file" .yaml; done)
CORE="alibi rope sinusoidal learned none"
REMEDY_ENCODINGS="rope sinusoidal learned none"
TASK_VARIANT_ENCODINGS="rope sinusoidal"  # learned cannot serve past its table, none learns no task

start=$(date +%s)
stamp() { echo "[reproduce] $(( ($(date +%s) - start) / 60 )) min: $*"; }

# Up to JOBS commands at a time; any failure fails the stage once all have ended.
failed=0
spawn() {
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || failed=1; done
    "$@" &
}
join() {
    while (( $(jobs -rp | wc -l) > 0 )); do wait -n || failed=1; done
    (( failed == 0 )) || { echo "[reproduce] a run failed (its error.txt says why)" >&2; (( KEEP_GOING )) || exit 1; }
}

# One run of the stage being listed: its folder name, then its train overrides.
RUNS=()
train() { RUNS+=("$*"); }
start_run() {
    local args
    read -r -a args <<< "$1"
    # quoted: a folder named by its overrides holds '=' and ',', which Hydra would parse
    spawn "$PYTHON" -m posbench train "${args[@]:1}" "${COMMON[@]}" "${THREADS[@]}" \
        "hydra.run.dir='$OUT/$GROUP/${args[0]}'" "${TRAIN_ARGS[@]}"
}

# train_len L trained with 4 x 256 tokens per step, evaluated at L x 1..32 up to 16,384
at_length() {
    local lens="" m
    for m in 1 2 4 8 16 32; do (( $1 * m <= 16384 )) && lens+="${lens:+,}$(( $1 * m ))"; done
    echo "train_len=$1" "train.batch_size=$(( 1024 / $1 ))" "eval_lens=[${lens}]"
}

stage_runs() {  # the runs of stage $1, started with train()
    local encoding seed length task
    case "$1" in
        seed0 | seed1 | seed2)
            seed=${1#seed}
            for encoding in $ENCODINGS; do train "encoding=${encoding},seed=${seed}" experiment=study \
                "encoding=$encoding" "seed=$seed" "train.val_lens=$VAL_LENS"; done ;;
        remedies)
            for encoding in $REMEDY_ENCODINGS; do
                train "encoding=${encoding},lengths=random" experiment=study "encoding=$encoding" \
                    'train.lengths=[64,128,256]' train.length_order=random
                train "encoding=${encoding},lengths=curriculum" experiment=study "encoding=$encoding" \
                    'train.lengths=[64,128,256]' train.length_order=curriculum
                [[ "$encoding" == none ]] || train "encoding=${encoding},randomized_positions=8192" \
                    experiment=study "encoding=$encoding" encoding.randomized_positions=8192
            done ;;
        lengths)
            for length in 64 128 512; do
                for encoding in alibi rope none sinusoidal; do
                    # shellcheck disable=SC2046
                    train "encoding=${encoding},train_len=${length}" experiment=study "encoding=$encoding" \
                        $(at_length "$length")
                done
            done ;;
        learned_table)
            for seed in 0 1 2; do train "encoding=learned,max_positions=4096,seed=${seed}" experiment=study \
                encoding=learned encoding.max_positions=4096 "seed=$seed" "train.val_lens=$VAL_LENS"; done ;;
        tasks0 | tasks1 | tasks2)
            seed=${1#tasks}
            for task in passkey mqar copy; do
                for encoding in $ENCODINGS; do train "task=${task},encoding=${encoding},seed=${seed}" \
                    "task=$task" "encoding=$encoding" "seed=$seed"; done
            done ;;
        copylm0)
            for encoding in $ENCODINGS; do train "encoding=${encoding},seed=0" experiment=copy_lm \
                "encoding=$encoding" seed=0; done ;;
        copylm_seeds)
            for seed in 1 2; do
                for encoding in alibi rope none fire; do train "encoding=${encoding},seed=${seed}" \
                    experiment=copy_lm "encoding=$encoding" "seed=$seed"; done
            done ;;
        task_remedies)
            for task in passkey copy; do
                for encoding in rope sinusoidal learned; do
                    train "task=${task},encoding=${encoding},randomized_positions=2048" "task=$task" \
                        "encoding=$encoding" encoding.randomized_positions=2048 seed=0
                done
            done ;;
        quick)
            for encoding in $CORE; do train "encoding=${encoding}" experiment=study "encoding=$encoding" \
                train.steps=300 train.patience=null eval.max_tokens=16384 'probes=[context,window]'; done ;;
        *) echo "[reproduce] unknown stage $1" >&2; exit 2 ;;
    esac
}

run_encoding() { awk '/^encoding:/ {inside = 1; next} inside && /^  name:/ {print $2; exit}' "$1/.hydra/config.yaml"; }

# RoPE context extension on run $1 at each factor $2...
rope_scalings() {
    local run=$1 type factor
    shift
    for type in linear ntk yarn; do
        for factor in "$@"; do eval_once "$run" rope.scaling.type=$type rope.scaling.factor=$factor; done
    done
}

# log-n scaling and attention temperatures on run $1
sharpenings() {
    local temperature
    eval_once "$1" model.logn_scaling=true
    for temperature in 1.25 1.5 2; do eval_once "$1" eval.attn_temperature=$temperature; done
}

# every evaluation of one finished run, one after another (two in one folder would race)
run_evals() {
    local run=$1 encoding seed
    encoding=$(run_encoding "$run")
    seed=$(sed -n 's/^seed: //p' "$run/.hydra/config.yaml")
    if [[ "$encoding" == rope ]]; then rope_scalings "$run" 4 16; fi
    if [[ "$seed" == 0 && " $REMEDY_ENCODINGS " == *" $encoding "* ]]; then sharpenings "$run"; fi
    if [[ "$encoding" == xpos ]]; then eval_once "$run" eval.blockwise=256; fi
    # the longest, last: at stride 256 the whole split would cost 63x the non-overlapping pass
    eval_once "$run" eval.mode=sliding "eval.stride=${STRIDE}" "eval.max_tokens=${SLIDING_TOKENS}"
}

# whether task run $1 learned its task, by its rows as trained (an empty variant, its column found by the header):
# a variant's own not_learned rows, written by an earlier call of this stage, say nothing of the model
learned_task() {
    [[ -s "$1/task_results.csv" ]] && ! awk -F, '
        NR == 1 {for (i = 1; i <= NF; i++) if ($i == "variant") column = i; next}
        column && $column == "" && /,not_learned,/ {found = 1}
        END {exit !found}' "$1/task_results.csv"
}

# the evaluation-time variants of one finished task run; none where it did not learn its task (nothing to extend)
run_task_evals() {
    local run=$1 encoding
    learned_task "$run" || return 0
    encoding=$(run_encoding "$run")
    if [[ "$encoding" == rope ]]; then rope_scalings "$run" 4 32; fi
    if [[ " $TASK_VARIANT_ENCODINGS " == *" $encoding "* ]]; then sharpenings "$run"; fi
}

# one evaluation of run $1, skipped when an earlier call finished it, so that a killed stage resumes at
# the evaluation it was in; the mark is named by every argument, so other settings evaluate again
eval_once() {
    local run=$1 args mark
    shift
    args=("$@" "checkpoint='$run'" "${COMMON[@]}" "${EVAL_ARGS[@]}")
    mark="$run/evals_done/$(printf '%s\n' "${args[@]}" | sha1sum | cut -c1-16)"
    [[ -e "$mark" ]] && return 0
    "$PYTHON" -m posbench eval "${args[@]}" "${THREADS[@]}"
    mkdir -p "$run/evals_done" && printf '%s\n' "${args[@]}" > "$mark"
}

# samples of run $1 past its training length, skipped when an earlier call finished them
generate_once() {
    local run=$1 args mark
    args=("checkpoint='$run'" "generate.prompts=$PROMPTS" "${COMMON[@]}")
    mark="$run/evals_done/generate-$(printf '%s\n' "${args[@]}" | sha1sum | cut -c1-16)"
    [[ -e "$mark" ]] && return 0
    "$PYTHON" -m posbench generate "${args[@]}" "${THREADS[@]}"
    mkdir -p "$run/evals_done" && printf '%s\n' "${args[@]}" > "$mark"
}

# a run still training has its best checkpoint.pt already, beside its last.pt
finished() { [[ -e "$1/checkpoint.pt" && ! -e "$1/last.pt" ]]; }

finished_runs() {  # those of the folders $@ that hold a finished run
    local run
    for run in "$@"; do
        if finished "$run"; then echo "${run%/}"; fi
    done
}

finished_seed_runs() { finished_runs "$OUT"/seed[0-2]/*/; }

report() {
    local folder
    for folder in "$OUT"/*/; do
        [[ "$(basename "$folder")" == report ]] || "$PYTHON" -m posbench report "$folder"
    done
    "$PYTHON" -m posbench report "$OUT" "compare=${COMPARE}"
}

archive() {
    local run dest
    for run in "$OUT"/*/*/; do
        finished "$run" || continue
        dest="$ARCHIVE/${run#"$OUT"/}"
        mkdir -p "$dest"
        (cd "$run" && find . -type f \( -name '*.csv' -o -name '*.log' -o -name '*.yaml' -o -name '*.jsonl' \) \
            -exec cp --parents -t "$dest" {} +)
        # the per-position and per-article rows are most of a run's bytes: kept gzipped (every reader takes .csv.gz)
        find "$dest" -maxdepth 1 \( -name per_position.csv -o -name per_article.csv -o -name samples.jsonl \) \
            -exec gzip -9nf {} +
    done
}

# STAGE is a group (seed0, remedies, evals, ...) or one part of it (seed0.2: its runs 5..8 at PART=4)
run_stage() {
    local group=${1%%.*} part="" first count item
    [[ "$1" == *.* ]] && part=${1#*.}
    GROUP=$group
    stamp "stage $1 into $OUT/$group"
    if [[ "$group" == report || "$group" == archive ]]; then "$group"; stamp "stage $1 done"; return; fi
    RUNS=()
    if [[ "$group" == evals ]]; then
        mapfile -t RUNS < <(finished_seed_runs)
    elif [[ "$group" == task_evals ]]; then
        mapfile -t RUNS < <(finished_runs "$OUT"/tasks0/*/)
    elif [[ "$group" == generate ]]; then
        mapfile -t RUNS < <(finished_seed_runs; finished_runs "$OUT"/learned_table/*/)
    else
        stage_runs "$group"
    fi
    first=0 count=${#RUNS[@]}
    if [[ -n "$part" ]]; then first=$(( (part - 1) * PART )) count=$PART; fi
    for item in "${RUNS[@]:first:count}"; do
        case "$group" in
            evals) spawn run_evals "$item" ;;
            task_evals) spawn run_task_evals "$item" ;;
            generate) spawn generate_once "$item" ;;
            *) start_run "$item" ;;
        esac
    done
    join
    stamp "stage $1 done"
}

if [[ "${1:-}" == list ]]; then
    for group in seed0 seed1 seed2 remedies lengths learned_table tasks0 tasks1 tasks2 task_remedies copylm0 copylm_seeds \
        quick; do
        RUNS=()
        stage_runs "$group"
        for (( i = 0; i < ${#RUNS[@]}; i++ )); do echo "${group}.$(( i / PART + 1 ))  $group/${RUNS[i]}"; done
    done
    echo "evals.N, generate.N  on finished seed runs N*PART-PART+1..N*PART; report; archive"
    exit 0
fi
if (( QUICK )); then
    stages=(quick report)
else
    stages=("$@")
    (( ${#stages[@]} )) || stages=(seed0 seed1 seed2 remedies lengths learned_table tasks0 tasks1 tasks2 task_remedies
                                   copylm0 copylm_seeds
                                   evals task_evals generate report)
fi
for stage in "${stages[@]}"; do run_stage "$stage"; done
stamp "done; wall time $(( $(date +%s) - start )) s"
(( failed == 0 ))
