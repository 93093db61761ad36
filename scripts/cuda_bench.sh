#!/usr/bin/env bash
# docs/performance.md, "On a GPU": every encoding's training and evaluation on CUDA.
#   1. training (batch 16 x 256) and evaluation at 16,384 tokens: eager and SDPA, fp32 and bf16
#      (autocast; AdamW's fused CUDA kernel in both);
#   2. training with model.compile=true, bf16, for rope.
# Usage, from a machine with a GPU:  OUT=outputs/cuda scripts/cuda_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-outputs/cuda}
bench() { "$PYTHON" -m posbench bench device=cuda xtransformers=false "$@"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
bench 'backends=[eager,sdpa]' 'precisions=[fp32,bf16]' 'eval_lens=[16384]' train_steps=10 warmup=3 \
    eval_repeats=1 "hydra.run.dir=$OUT/train"
bench 'encodings=[rope]' 'backends=[sdpa]' 'precisions=[bf16]' compile_train=true 'eval_lens=[1024]' \
    train_steps=20 warmup=5 eval_repeats=1 "hydra.run.dir=$OUT/compile"
