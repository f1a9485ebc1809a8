#!/usr/bin/env bash
# The pipeline bubble measured on CPU ranks: configs/tiny-llama.yaml with 8 layers
# (hidden 128, byte-level vocabulary, so the stages split evenly: 4 + 4, or 2 per
# virtual stage) under pp 2 (2 ranks, one thread each) with one model chunk per stage
# (1F1B) against 2 (interleaved 1F1B, parallel.vpp: 2), for m = 2 and 4 micro-batches
# of 512 tokens per step (documents of at least 600 bytes cut at data.max_seq_len 512,
# so no micro-batch is nearly empty). Per run: the median step time (step_ms), idle
# fraction (1 - mean busy / step) and step over the ranks' mean busy time
# (1 / (1 - idle): the step over the ideal one, in which every stage computes all
# the time) of its steps after the first two, of the steps that ran m micro-batches
# (each run's median step_ms is printed as it ends, the table pools all runs'
# steps). Both settings read the same batches in the same order (one seed), so
# their steps pair up. The runs alternate (vpp 1, vpp 2, vpp 1, ...) so
# that load from other processes falls on both alike. The simulator's step over the
# ideal (every stage busy, free transfers) is 1 + (pp - 1) / (vpp m): 1.5 and 1.25 at
# m = 2, 1.25 and 1.125 at m = 4; its idle fraction (pp - 1) / (vpp m + pp - 1).
#
#   bench/interleaved_bubble.sh [STEPS] [PAIRS]   (default 40 3)
#   TRAINER=path/to/trainer picks the binary (default BUILD_DIR or build/, trainer/trainer)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${TRAINER:-${BUILD_DIR:-$root/build}/trainer/trainer}"
steps="${1:-40}"
pairs="${2:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1

"$trainer" make-corpus --output "$work/corpus.h5" --documents 3000 --min-length 600 --median-length 1500 \
  --max-length 4000 >/dev/null 2>&1

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) {print "nan"; exit} print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

run() {  # m vpp pair -> "step_ms idle" per kept step in $work/M-VPP-PAIR.txt
  local m=$1 vpp=$2 pair=$3 dir="$work/$1-$2-$3"
  mpirun --oversubscribe -np 2 "$trainer" train "$root/configs/tiny-llama.yaml" --set data.path="$work/corpus.h5" \
    --set model.num_layers=8 --set data.max_seq_len=512 --set data.micro_batch_tokens=512 \
    --set data.global_batch_tokens=$((512 * m)) --set parallel.pp=2 --set parallel.vpp="$vpp" \
    --set train.steps="$steps" --set train.threads=1 --set train.run_dir="$dir" --set train.peak_flops=1e11 \
    >"$dir.log" 2>&1 || { echo "run m=$m vpp=$vpp/$pair failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  grep -o '"micro_batches": [0-9]*\|"step_ms": [0-9.e+-]*\|"idle_fraction": [0-9.e+-]*' "$dir/metrics.jsonl" |
    awk '{print $2}' | paste - - - | tail -n +3 | awk -v m="$m" '$1 == m {print $2, $3}' >"$work/$m-$vpp-$pair.txt"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-3s %-4s %-10s %-8s %-10s %-6s | %s\n' m vpp step_ms idle step/busy steps 'formula: step/ideal, idle'
for m in 2 4; do
  for pair in $(seq "$pairs"); do
    for vpp in 1 2; do
      run "$m" "$vpp" "$pair"
      echo "  run $pair, m $m, vpp $vpp: median step_ms $(awk '{print $1}' "$work/$m-$vpp-$pair.txt" | median)"
    done
  done
  for vpp in 1 2; do
    cat "$work/$m-$vpp-"*.txt >"$work/$m-$vpp.all"
    printf '%-3s %-4s %-10s %-8s %-10s %-6s | %s %s\n' "$m" "$vpp" "$(awk '{print $1}' "$work/$m-$vpp.all" | median)" \
      "$(awk '{print $2}' "$work/$m-$vpp.all" | median)" \
      "$(awk '{printf "%.3f\n", 1 / (1 - $2)}' "$work/$m-$vpp.all" | median)" "$(wc -l <"$work/$m-$vpp.all")" \
      "$(awk -v m="$m" -v v="$vpp" 'BEGIN {printf "%.3f", 1 + 1 / (v * m)}')" \
      "$(awk -v m="$m" -v v="$vpp" 'BEGIN {printf "%.3f", 1 / (v * m + 1)}')"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
