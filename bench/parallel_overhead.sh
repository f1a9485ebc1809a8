#!/usr/bin/env bash
# The cost of each parallel dimension on this machine: the same global batches of
# configs/bench-llama.yaml (4 micro-batches of 1024 tokens per step) trained under
# several (tp, pp, hdp) layouts, in one run. For each layout: the median step time
# of steps 2..N against the single-process run, and the bytes rank 0 sent per step
# through each group next to the analytic expectation (Megatron-style formulas,
# ring collectives: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n of
# the buffer):
#   tp:  per layer 2 all-reduces forward + 2 backward of [T, H]; the embedding 1,
#        the LM head's input gradient 1 and the loss statistics 2 small ones;
#   pp:  stage 0 sends each micro-batch's [T, H] activation forward;
#   hdp: ZeRO-1 reduce-scatter of the gradients + all-gather of the parameters.
# T = tokens of rank 0's micro-batches in the step.
#
#   bench/parallel_overhead.sh [STEPS]        (default 4; prints a markdown table)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${BUILD_DIR:-$root/build}/trainer/trainer"
steps="${1:-4}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1

"$trainer" make-corpus --output "$work/corpus.h5" --documents 2000 >/dev/null 2>&1
# bench-llama's shape: H 512, 8 layers, 8 heads (d 64), 4 KV heads, FFN 1376, vocab 32000.
H=512; L=8; QD=512; KV=256; F=1376; V=32000

run() {  # tp pp hdp -> "median_step_ms rank_tokens tp_bytes pp_bytes hdp_bytes"
  local tp=$1 pp=$2 hdp=$3 dir="$work/run-$1-$2-$3"
  local ranks=$((tp * pp * hdp))
  local launch=("$trainer")
  [ "$ranks" -gt 1 ] && launch=(mpirun --oversubscribe -np "$ranks" "$trainer")
  "${launch[@]}" train "$root/configs/bench-llama.yaml" --set data.path="$work/corpus.h5" \
    --set data.micro_batch_tokens=1024 --set train.steps="$steps" --set train.run_dir="$dir" \
    --set train.peak_flops=1e11 --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.hdp="$hdp" \
    >"$dir.log" 2>&1 || { echo "run $tp/$pp/$hdp failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  local metrics="$dir/metrics.jsonl"
  field() { grep -o "\"$1\": [0-9.e+-]*" "$metrics" | tail -n +2 | awk '{print $2}'; }
  local ms
  ms=$(field step_ms | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
  # Layers on stage 0 as the trainer's cost model split them ("stage 0 (layers 6 + 2)").
  local layers
  layers=$(grep -o 'stage 0 (layers [0-9]*' "$dir.log" | head -1 | awk '{print $4}')
  echo "$ms $(field rank_tokens | tail -1) $(field tp_bytes | tail -1) $(field pp_bytes | tail -1) $(field hdp_bytes | tail -1) $layers"
}

expected() {  # tp pp hdp tokens stage0_layers -> "tp_bytes pp_bytes hdp_bytes" analytic for rank 0
  awk -v tp="$1" -v pp="$2" -v hdp="$3" -v T="$4" -v layers="$5" -v H=$H -v L=$L -v QD=$QD -v KV=$KV -v F=$F -v V=$V 'BEGIN {
    last = (pp == 1)                     # rank 0 also holds the head when there is one stage
    ring = (tp > 1) ? 2 * (tp - 1) / tp : 0
    tpb = ring * 4 * (T * H * (4 * layers + 1 + last) + last * 3 * T)
    ppb = (pp > 1) ? 4 * T * H : 0
    params = V / tp * H + layers * (2 * H + (H * QD + 2 * H * KV + QD * H) / tp + 3 * H * F / tp) + last * (H + V / tp * H)
    hdpb = (hdp > 1) ? 2 * (hdp - 1) / hdp * 4 * params : 0
    printf "%d %d %d\n", tpb, ppb, hdpb
  }'
}

echo "| layout | ranks | stage 0 layers | step ms (median) | vs 1 rank | tp MB sent (expected) | pp MB sent (expected) | hdp MB sent (expected) |"
echo "|---|---|---|---|---|---|---|---|"
base=""
for layout in "1 1 1" "2 1 1" "1 2 1" "1 1 2" "2 2 1" "2 1 2" "1 2 2"; do
  read -r tp pp hdp <<<"$layout"
  read -r ms tokens tpb ppb hdpb layers <<<"$(run $tp $pp $hdp)"
  read -r etp epp ehdp <<<"$(expected $tp $pp $hdp "$tokens" "$layers")"
  [ -z "$base" ] && base=$ms
  awk -v l="tp$tp pp$pp hdp$hdp" -v r=$((tp * pp * hdp)) -v n="$layers" -v ms="$ms" -v b="$base" \
      -v a="$tpb" -v ea="$etp" -v p="$ppb" -v ep="$epp" -v h="$hdpb" -v eh="$ehdp" \
      'BEGIN { printf "| %s | %d | %d | %d | %.2f | %.1f (%.1f) | %.1f (%.1f) | %.1f (%.1f) |\n", l, r, n, ms, ms / b, a / 1e6, ea / 1e6, p / 1e6, ep / 1e6, h / 1e6, eh / 1e6 }'
done
echo
echo "$(grep -o 'OpenBLAS [A-Za-z0-9]* kernels' "$work"/run-1-1-1.log | head -1), $(nproc) cores, $steps steps per layout"
