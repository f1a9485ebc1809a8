#!/usr/bin/env bash
# What checkpointing every step costs: configs/tiny-llama.yaml and
# configs/bench-llama.yaml (one process each) trained with no checkpoints, with
# train.checkpoint_every: 1 and asynchronous writes (the default), and with
# synchronous writes, in one run of this script, on the same byte-level corpus.
# Every due checkpoint is written (train.checkpoint_budget: 0), so that each step
# has one; bench/checkpoint_step_cost.sh measures the default budget.
#
# The figure that matters is measured inside each run, so that load from other
# processes (which moves step times by several x on a shared machine) cancels:
# the time the training thread waited for the checkpoint at each step ("training
# waited X ms": the snapshot copy plus any previous write still running, or the
# whole write when synchronous), as a fraction of the step's own time (step_ms in
# metrics.jsonl), medians over the steps after the first two. The step time of each
# run is shown too: in async mode it also carries the background writer's
# competition for the cores, which only the comparison across runs shows (and
# that comparison is only as good as the machine is quiet).
#
#   bench/checkpoint_overhead.sh [TINY_STEPS] [BENCH_STEPS]   (default 20 and 8; prints a markdown table)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${BUILD_DIR:-$root/build}/trainer/trainer"
tiny_steps="${1:-20}"
bench_steps="${2:-8}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$trainer" make-corpus --output "$work/corpus.h5" --documents 2000 >/dev/null 2>&1

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) {print "nan"; exit} print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

run() {  # config steps mode -> "median_step_ms median_wait_ms checkpoint_mb median_write_ms"
  local config=$1 steps=$2 mode=$3 dir="$work/run-$(basename "$1" .yaml)-$3"
  local every=1 async=true
  [ "$mode" = none ] && every=0
  [ "$mode" = sync ] && async=false
  "$trainer" train "$root/configs/$config" --set data.path="$work/corpus.h5" --set train.steps="$steps" \
    --set train.run_dir="$dir" --set train.checkpoint_dir="$dir/ckpt" --set train.checkpoint_every=$every \
    --set train.async_checkpoints=$async --set train.checkpoint_budget=0 --set train.keep_checkpoints=2 \
    --set train.log_every=1 \
    --set train.resume=never --set train.peak_flops=1e11 >"$dir.log" 2>&1 ||
    { echo "run $config/$mode failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  local step_ms wait_ms=0 write_ms=0 mb=0
  step_ms=$(grep -o '"step_ms": [0-9.e+-]*' "$dir/metrics.jsonl" | tail -n +3 | awk '{print $2}' | median)
  if [ "$every" = 1 ]; then
    wait_ms=$(grep -o 'training waited [0-9.]* ms' "$dir.log" | tail -n +3 | awk '{print $3}' | median)
    write_ms=$(grep -o 'written in [0-9.]* ms' "$dir.log" | tail -n +3 | awk '{print $3}' | median)
    mb=$(du -sm "$(ls -d "$dir"/ckpt/step-* | grep -v '\.tmp$' | tail -1)" | awk '{print $1}')
  fi
  echo "$step_ms $wait_ms $mb $write_ms"
}

echo "| config | checkpoints | size (MB) | write, median (ms) | step_ms, median | training waited per step, median (ms) | waited / step_ms |"
echo "|---|---|---|---|---|---|---|"
for spec in "tiny-llama.yaml $tiny_steps" "bench-llama.yaml $bench_steps"; do
  set -- $spec
  for mode in none async sync; do
    read -r ms wait mb write <<<"$(run "$1" "$2" "$mode")"
    if [ "$mode" = none ]; then
      echo "| $1 | none | - | - | $ms | - | - |"
    else
      echo "| $1 | every step, $mode | $mb | $write | $ms | $wait | $(awk -v w="$wait" -v s="$ms" 'BEGIN {printf "%.2f%%", 100 * w / s}') |"
    fi
  done
done
