#!/usr/bin/env bash
# What checkpointing every step costs: configs/tiny-llama.yaml and
# configs/bench-llama.yaml (one process each) trained with no checkpoints, with
# train.checkpoint_every: 1 and asynchronous writes (the default), and with
# synchronous writes, in one run of this script, one after the other, on the same
# byte-level corpus. A step's cost is the wall time between consecutive step log
# lines (so it includes whatever the checkpoint makes the training thread wait
# for: the snapshot copy, a previous write still running, or the whole write when
# synchronous), median over the steps after the first two; also the median time
# the training thread spent in the snapshot ("state copied in X ms").
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

run() {  # config steps mode -> "median_step_ms median_snapshot_ms checkpoint_mb"
  local config=$1 steps=$2 mode=$3 dir="$work/run-$(basename "$1" .yaml)-$3"
  local every=1 async=true
  [ "$mode" = none ] && every=0
  [ "$mode" = sync ] && async=false
  "$trainer" train "$root/configs/$config" --set data.path="$work/corpus.h5" --set train.steps="$steps" \
    --set train.run_dir="$dir" --set train.checkpoint_dir="$dir/ckpt" --set train.checkpoint_every=$every \
    --set train.async_checkpoints=$async --set train.keep_checkpoints=2 --set train.log_every=1 \
    --set train.resume=never --set train.peak_flops=1e11 >"$dir.log" 2>&1 ||
    { echo "run $config/$mode failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  # Wall time between consecutive step lines, steps 3..N.
  local step_ms snap_ms mb=0
  step_ms=$(grep -E '\] info step +[0-9]+/' "$dir.log" |
    awk -F'[][]' '{split($2, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3]; if (NR > 2) print (s - prev) * 1000; prev = s}' | median)
  snap_ms=$(grep -o 'state copied in [0-9.]* ms' "$dir.log" | awk '{print $4}' | median)
  if [ "$every" = 1 ]; then
    mb=$(du -sm "$(ls -d "$dir"/ckpt/step-* | grep -v '\.tmp$' | tail -1)" | awk '{print $1}')
  fi
  echo "$step_ms $snap_ms $mb"
}

echo "| config | checkpoints | checkpoint size (MB) | step wall time, median (ms) | vs none | snapshot, median (ms) |"
echo "|---|---|---|---|---|---|"
for spec in "tiny-llama.yaml $tiny_steps" "bench-llama.yaml $bench_steps"; do
  set -- $spec
  base=""
  for mode in none async sync; do
    read -r ms snap mb <<<"$(run "$1" "$2" "$mode")"
    [ -z "$base" ] && base=$ms
    overhead=$(awk -v a="$ms" -v b="$base" 'BEGIN {printf "%+.1f%%", 100 * (a - b) / b}')
    label=$([ "$mode" = none ] && echo "none" || echo "every step, $mode")
    echo "| $1 | $label | $([ "$mode" = none ] && echo - || echo "$mb") | $ms | $([ "$mode" = none ] && echo - || echo "$overhead") | $([ "$mode" = async ] && echo "$snap" || echo -) |"
  done
done
