#!/usr/bin/env bash
# Static context parallelism against hybrid data parallelism on the same skewed
# global batches, in one invocation: the demo corpus with a long tail (documents
# from 16 tokens to 8192, most of them a few hundred), sequences up to 8192
# tokens, 2048 tokens per rank and micro-batch, 4 ranks (hdp = 4), a 4-layer
# model with 256 hidden units. Policies:
#   static              dp x cp grid with cp = 4: every sequence split over 4 ranks
#   naive               HDP (Algorithm 1): short sequences whole on one rank, long ones
#                       on as few ranks as they need, with selective offload
#   naive, no offload   HDP without offload (long sequences need more ranks)
#   balance             HDP with the balance scheduler (Algorithm 2, DP-Balance), cost
#                       model derived from FLOPs at the measured GEMM rate
#   balance, measured   the same with the cost model profiled at start-up
# Reported per policy: median step time of steps 2..N, ring attention bytes per
# step (whole job), per-rank busy time (forward + backward, min and max) and the
# idle fraction, and the speed-up over static.
#
#   bench/hdp_policies.sh [STEPS]       (default 5; prints a markdown table)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${BUILD_DIR:-$root/build}/trainer/trainer"
steps="${1:-5}"
ranks=4
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1

"$trainer" make-corpus --output "$work/corpus.h5" --documents 3000 --max-length 8192 --median-length 400 \
  --seed 11 >/dev/null 2>&1

run() {  # name extra-args... -> "median_ms attention_MB busy_min busy_max idle"
  local name=$1
  shift
  local dir="$work/$name"
  mpirun --oversubscribe -np $ranks "$trainer" train "$root/configs/tiny-llama.yaml" --set data.path="$work/corpus.h5" \
    --set model.hidden_size=256 --set model.num_heads=4 --set model.num_kv_heads=2 --set model.ffn_hidden_size=704 \
    --set data.max_seq_len=8192 --set data.micro_batch_tokens=2048 --set data.global_batch_tokens=32768 \
    --set data.shuffle=false --set train.steps="$steps" --set train.run_dir="$dir" --set train.checkpoint_every=0 \
    --set train.log_every=1 --set parallel.hdp=$ranks "$@" >"$dir.log" 2>&1 ||
    { echo "run $name failed:" >&2; tail -20 "$dir.log" >&2; exit 1; }
  field() { grep -o "\"$1\": [0-9.e+-]*" "$dir/metrics.jsonl" | tail -n +2 | awk '{print $2}'; }
  median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
  echo "$(field step_ms | median) $(field attention_bytes | median) $(field busy_ms_min | median)" \
       "$(field busy_ms_max | median) $(field idle_fraction | median)"
}

echo "| policy | step ms (median) | speed-up over static | attention MB per step | busy ms per rank (min - max) | idle fraction |"
echo "|---|---|---|---|---|---|"
base=""
for policy in "static|--set scheduler.policy=static --set scheduler.cp=4" \
              "naive|--set scheduler.policy=naive" \
              "naive, no offload|--set scheduler.policy=naive --set offload.enabled=false" \
              "balance|--set scheduler.policy=balance" \
              "balance, measured costs|--set scheduler.policy=balance --set scheduler.cost_file=profile"; do
  name="${policy%%|*}"
  read -r -a args <<<"${policy#*|}"
  read -r ms bytes bmin bmax idle <<<"$(run "$(printf '%s' "$name" | tr -c 'a-z' '_')" "${args[@]}")"
  [ -z "$base" ] && base=$ms
  awk -v n="$name" -v ms="$ms" -v b="$base" -v by="$bytes" -v lo="$bmin" -v hi="$bmax" -v idle="$idle" \
    'BEGIN { printf "| %s | %.0f | %.2f | %.1f | %.0f - %.0f | %.2f |\n", n, ms, b / ms, by / 1e6, lo, hi, idle }'
done
echo
echo "$ranks ranks on $(nproc) cores, $steps steps per policy (median of steps 2..$steps)," \
     "$(grep -o 'OpenBLAS [A-Za-z0-9]* kernels' "$work"/static.log | head -1)"
