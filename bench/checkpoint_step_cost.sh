#!/usr/bin/env bash
# What every-step checkpoints cost as a user feels it: the median wall time per step
# (from one step's end to the next, metrics.jsonl's "time": a wait for the previous
# write included) of a config trained with train.checkpoint_every: 1 (asynchronous
# writes and train.checkpoint_budget, the defaults: checkpoints as often as the
# budget allows) against the same config without checkpoints. A run's first
# checkpoint is written at step 1, before its cost is known; runs several budget
# intervals long show the steady state. The runs alternate (none, every
# step, none, every step, ...) in one run of this script, so that load from other
# processes falls on both alike; each row is one such pair, and the last compares
# the medians of all their steps. Unlike bench/checkpoint_overhead.sh (the time the
# training thread waits for the snapshot), this includes the background writer's
# competition for the cores.
#
#   bench/checkpoint_step_cost.sh [CONFIG] [STEPS] [PAIRS]   (default tiny-llama.yaml 12 3)
#   TRAINER=path/to/trainer picks the binary (default BUILD_DIR or build/, trainer/trainer)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${TRAINER:-${BUILD_DIR:-$root/build}/trainer/trainer}"
config="${1:-tiny-llama.yaml}"
steps="${2:-12}"
pairs="${3:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$trainer" make-corpus --output "$work/corpus.h5" --documents 2000 >/dev/null 2>&1

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) {print "nan"; exit} print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

run() {  # mode pair -> the run's wall times per step after its first two steps, one a line, in $work/MODE-PAIR.ms
  local mode=$1 pair=$2 dir="$work/$1-$2" every=1
  [ "$mode" = none ] && every=0
  "$trainer" train "$root/configs/$config" --set data.path="$work/corpus.h5" --set train.steps="$steps" \
    --set train.run_dir="$dir" --set train.checkpoint_dir="$dir/ckpt" --set train.checkpoint_every=$every \
    --set train.keep_checkpoints=2 --set train.resume=never --set train.peak_flops=1e11 >"$dir.log" 2>&1 ||
    { echo "run $mode/$pair failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  # Wall time from one step's end to the next (metrics.jsonl's "time"), which holds any
  # wait for the previous checkpoint's write; step_ms covers the step's own work only.
  grep -o '"time": [0-9.e+-]*' "$dir/metrics.jsonl" | awk '{print $2}' |
    awk 'NR > 1 {printf "%.3f\n", ($1 - last) * 1000} {last = $1}' | tail -n +2 >"$work/$mode-$pair.ms"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b / a}'; }

echo "$config, $steps steps a run, $pairs pairs; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| pair | ms per step (wall), median, no checkpoints | the same, every step | every step / none |"
echo "|---|---|---|---|"
for pair in $(seq "$pairs"); do
  run none "$pair"
  run every "$pair"
  none=$(median <"$work/none-$pair.ms")
  every=$(median <"$work/every-$pair.ms")
  echo "| $pair | $none | $every | $(ratio "$none" "$every") |"
done
none=$(cat "$work"/none-*.ms | median)
every=$(cat "$work"/every-*.ms | median)
echo "| all | $none | $every | **$(ratio "$none" "$every")** |"
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
