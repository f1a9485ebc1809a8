#!/usr/bin/env bash
# Builds the trainer, writes the demo corpus once, and trains configs/tiny-llama.yaml.
# Extra arguments go to `trainer train`, e.g. scripts/demo.sh --set train.steps=50
# It installs and builds only what it runs: the trainer binary, without the tests
# and benchmarks (scripts/test.sh builds everything), and the CUDA backend only
# where a GPU answers nvidia-smi or HDP_CUDA=ON asks for it (HDP_CUDA=OFF: never).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

if [ -z "${HDP_CUDA:-}" ]; then
  HDP_CUDA=OFF
  if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then HDP_CUDA=ON; fi
fi
export HDP_CUDA
HDP_DEPS=demo bash "$root/scripts/build.sh" -DHDP_CUDA="$HDP_CUDA" -DHDP_BUILD_TESTS=OFF -DHDP_BUILD_BENCH=OFF trainer
cd "$root"
trainer="$build_dir/trainer/trainer"
corpus="data-cache/demo-corpus.h5"
if [ ! -f "$corpus" ]; then
  "$trainer" make-corpus --output "$corpus"
fi
# A fresh run each time: earlier checkpoints of the demo would otherwise be resumed.
rm -rf runs/tiny-llama
"$trainer" train configs/tiny-llama.yaml "$@"
echo "metrics: runs/tiny-llama/metrics.jsonl"
# What the model learned: a greedy continuation from its last checkpoint (the
# config saves one every 100 steps; a run shorter than that has none).
if ls runs/tiny-llama/checkpoints/step-* > /dev/null 2>&1; then
  echo "sample:"
  "$trainer" generate runs/tiny-llama/checkpoints --prompt "Where does Clara live?" --max-new-tokens 80
fi
