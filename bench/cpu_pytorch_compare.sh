#!/usr/bin/env bash
# The CPU comparison of issue 9, in one run on one machine: a bench-llama training step
# of ours (build/bench/train_step_bench, with the machine's 2048^3 SGEMM rate measured in
# the same process; median of 5 steps after 2 untimed warm-ups) next to Hugging Face
# LlamaForCausalLM on PyTorch, eager and torch.compile, on the same shape and tokens
# per step (4 x 1024 tokens, fp32, AdamW), then ours again (A/B/A), with a clean
# OpenBLAS environment.
#
#   bench/cpu_pytorch_compare.sh PYTHON [BUILD_DIR]
# PYTHON: a python3 of a throwaway virtual environment with torch and transformers.
set -euo pipefail
python="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${2:-$root/build}"
clean=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
lscpu | sed -n 's/^Model name: *//p'
ours() {
  "${clean[@]}" "$build/bench/train_step_bench" 2>&1 |
    grep -E "BM_GemmReference|_median|_cv|openblas_core|threads" || true
}
echo "== ours"; ours
echo "== PyTorch (eager, torch.compile)"
"${clean[@]}" "$python" "$root/bench/pytorch_llama_baseline.py" --device cpu --shape bench-llama \
  --precisions fp32 --steps 3 --warmup 2 --compile --peak 1e12 2>&1 | grep -E "^torch|^pytorch-hf"
echo "== ours again"; ours
