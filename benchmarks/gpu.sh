#!/usr/bin/env bash
# One GPU run of benchmarks/gpu.py at the paper's shape (12 x 768, 512 tokens, batch 32, bf16): kgpt's
# attention variants beside keras-hub's GPT-2, pre-training and fine-tuning at 128 and 512 tokens, in
# under 8 minutes on one H100 or H200. Extra arguments go to gpu.py (e.g. --tiny on a CPU, --budget_s).
# `timeout` ends gpu.py whatever happens (after 8 minutes; 31 with --tiny); gpu.py's children end with
# it (each asks the kernel for a signal when its parent ends).
set -euo pipefail
cd "$(dirname "$0")/.."
export KERAS_BACKEND=jax TF_CPP_MIN_LOG_LEVEL=2
limit=480
for arg in "$@"; do
    if [ "$arg" = "--tiny" ]; then limit=1860; fi
done
exec timeout --signal=TERM --kill-after=10 "$limit" python benchmarks/gpu.py "$@"
