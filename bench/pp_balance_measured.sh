#!/usr/bin/env bash
# The balance scheduler under pipelines on CPU ranks, measured against its own
# simulator: configs/tiny-llama.yaml (hidden 128, 4 layers: 2 per stage) with
# scheduler.policy balance, whose candidates under pp > 1 are compared by the step
# simulator fed with the run's own costs (run/step_planner.h, run/step_costs.h): a
# cost file `trainer profile` measures first, alone and with one thread
# (scheduler.cost_file: profile would measure on every rank at once, each rank's
# share of an oversubscribed core, and predict that share's speed). Per
# step, from metrics.jsonl: the measured step (step_ms) against the plan's simulated
# step (planned_step_ms), and the busiest rank's measured busy time (busy_ms_max)
# against its prediction (planned_busy_ms_max); then the medians over the steps
# after the first two (warm-up) of both ratios and of the first over the second: the
# step's error with the cost model's error in the ranks' compute rate divided out,
# what is left for the simulator's pipeline bubbles, ring waits and transfers.
#
# Two layouts, one thread per rank, documents of up to 6,000 bytes cut at 1,024 tokens:
#   pp 2 x hdp 2 (4 ranks): micro-batches of 512 tokens, so every 1,024-token sequence
#     runs on a ring of 2 (2 layers per stage: offload frees nothing); 8,192 tokens
#     per step. On a 2-core machine the 4 ranks oversubscribe the cores
#     (OMPI_MCA_mpi_yield_when_idle=1): ranks computing at once share a core, and a
#     rank waiting in MPI still takes turns on it; the simulator's ranks each own a
#     processor, so it predicts a shorter step than the oversubscribed ranks take.
#   pp 2 x hdp 1 (2 ranks, one per core): micro-batches of 1,024 tokens, no rings;
#     4,096 tokens per step: the pipeline's error without oversubscription.
#
#   bench/pp_balance_measured.sh [STEPS]   (default 20; at least 3)
#   TRAINER=path/to/trainer picks the binary (default BUILD_DIR or build/, trainer/trainer)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${TRAINER:-${BUILD_DIR:-$root/build}/trainer/trainer}"
steps="${1:-20}"
[[ "$steps" =~ ^[0-9]+$ ]] && [ "$steps" -ge 3 ] || { echo "pp_balance_measured.sh: STEPS must be a number >= 3, got '$steps'" >&2; exit 2; }
[ -x "$trainer" ] || { echo "pp_balance_measured.sh: no trainer binary at $trainer (build it, or set TRAINER)" >&2; exit 2; }
cores="$(nproc)"  # before OMP_NUM_THREADS, which nproc reports instead
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1

"$trainer" make-corpus --output "$work/long.h5" --documents 400 --max-length 6000 --seed 7 >/dev/null 2>&1
"$trainer" profile "$root/configs/tiny-llama.yaml" --set data.max_seq_len=1024 --set train.threads=1 \
  --output "$work/cost.yaml" >"$work/profile.log" 2>&1 || { cat "$work/profile.log" >&2; exit 1; }

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) {print "nan"; exit} print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# The value of numeric key $1 on each line of metrics.jsonl $2.
column() { grep -o "\"$1\": [0-9.e+-]*" "$2" | awk '{print $2}'; }

run() {  # name ranks hdp micro_batch_tokens global_batch_tokens
  local name=$1 ranks=$2 hdp=$3 mbt=$4 gbt=$5 dir="$work/$1"
  mpirun --oversubscribe -np "$ranks" "$trainer" train "$root/configs/tiny-llama.yaml" \
    --set data.path="$work/long.h5" --set data.max_seq_len=1024 --set data.micro_batch_tokens="$mbt" \
    --set data.global_batch_tokens="$gbt" --set parallel.pp=2 --set parallel.hdp="$hdp" \
    --set scheduler.policy=balance --set scheduler.cost_file="$work/cost.yaml" --set train.steps="$steps" \
    --set train.threads=1 --set train.checkpoint_every=0 --set train.peak_flops=1e11 --set train.run_dir="$dir" \
    >"$dir.log" 2>&1 || { echo "run $name failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  local m="$dir/metrics.jsonl"
  paste <(grep -o '"step": [0-9]*' "$m" | awk '{print $2}') <(column step_ms "$m") <(column planned_step_ms "$m") \
    <(column busy_ms_max "$m") <(column planned_busy_ms_max "$m") <(column attention_bytes "$m") >"$dir.tsv"
  echo "== $name: $ranks ranks (pp 2 x hdp $hdp), micro-batches of $mbt tokens, $gbt per step"
  printf '%-5s %-9s %-9s %-10s %-9s %-9s %-10s %s\n' step step_ms simulated measured/ busy_max planned measured/ \
    ring_bytes
  printf '%-5s %-9s %-9s %-10s %-9s %-9s %-10s\n' "" "" "" simulated "" busy_max planned
  awk '{printf "%-5d %-9.1f %-9.1f %-10.3f %-9.1f %-9.1f %-10.3f %d\n", $1, $2, $3, $2 / $3, $4, $5, $4 / $5, $6}' \
    "$dir.tsv"
  echo "median over steps 3-$steps: step_ms / planned_step_ms $(tail -n +3 "$dir.tsv" | awk '{print $2 / $3}' | median)," \
    "busy_ms_max / planned_busy_ms_max $(tail -n +3 "$dir.tsv" | awk '{print $4 / $5}' | median)," \
    "the first over the second $(tail -n +3 "$dir.tsv" | awk '{print ($2 / $3) / ($4 / $5)}' | median)"
}

echo "$(date -u '+%F %H:%M') UTC, $cores cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
run pp2-hdp2-rings 4 2 512 8192
run pp2-hdp1 2 1 1024 4096
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
