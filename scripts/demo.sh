#!/usr/bin/env bash
# Builds the trainer, writes the demo corpus once, and trains configs/tiny-llama.yaml.
# Extra arguments go to `trainer train`, e.g. scripts/demo.sh --set train.steps=50
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

bash "$root/scripts/build.sh"
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
