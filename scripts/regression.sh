#!/usr/bin/env bash
# Regression runs: trains a list of configurations for a fixed number of steps and
# compares each step's loss and gradient norm, and the mean throughput, with the
# golden files in tests/golden/ (one NAME.tsv per configuration). Prints a table
# and exits 1 on a regression (a run that fails, a missing golden, a loss or
# gradient norm outside its tolerance), 0 otherwise.
#
#   scripts/regression.sh [options]
#     --trainer PATH         the binary (default build/trainer/trainer)
#     --only A,B             only these configurations (default: all that fit --max-ranks)
#     --max-ranks N          skip configurations needing more ranks (default 4)
#     --loss-rtol X          relative tolerance of each step's loss (default 1e-5;
#                            bf16 configurations 1e-4)
#     --grad-rtol X          relative tolerance of each step's gradient norm (default
#                            1e-4; bf16 configurations 1e-2)
#     --throughput-factor F  warn when the mean tokens/s is below golden / F (default 3)
#     --fail-slow            make that warning a failure
#     --work DIR             where runs go (default: a temporary directory, removed)
#     --update               rewrite the goldens from these runs (review the diff first)
#     --list                 print the configurations and exit
#
# Every run uses one thread per rank (train.threads=1, OMP_NUM_THREADS=1): the
# trainer is deterministic for a given thread count, so losses reproduce to the
# bit on the machine that wrote the goldens; another CPU (another GEMM kernel,
# another libm) may differ in the last bits, which the tolerances absorb. In bf16 a
# value the summation order puts on the other side of a rounding boundary moves by a
# bf16 step (2^-8 of it), so bf16 configurations take the looser tolerances the
# selftest derives for bf16 training (trainer/selftest.cpp, training_tolerances):
# the bf16 golden, written on one AMD EPYC, differed by 1.7e-5 in a loss on another.
# Throughput differs between machines, hence only a warning by default.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
golden_dir="$root/tests/golden"
trainer="$root/build/trainer/trainer"
only=""
max_ranks=4
loss_rtol=""  # empty: the defaults, per precision
grad_rtol=""
throughput_factor=3
fail_slow=0
work=""
update=0
list=0

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --trainer) trainer="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --max-ranks) max_ranks="$2"; shift 2 ;;
    --loss-rtol) loss_rtol="$2"; shift 2 ;;
    --grad-rtol) grad_rtol="$2"; shift 2 ;;
    --throughput-factor) throughput_factor="$2"; shift 2 ;;
    --fail-slow) fail_slow=1; shift ;;
    --work) work="$2"; shift 2 ;;
    --update) update=1; shift ;;
    --list) list=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "regression.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$max_ranks" =~ ^[0-9]+$ ]] || { echo "regression.sh: --max-ranks expects a number, got '$max_ranks'" >&2; exit 2; }

# The configurations: NAME|RANKS|CORPUS|OVERRIDES. All start from
# configs/tiny-llama.yaml and run STEPS steps. Corpora: "demo" is the default demo
# corpus (400 documents), "long" has documents up to 6000 bytes for rings.
# The demo-corpus runs take 2048-token batches (two micro-batches of 1024) to stay
# quick on small machines.
steps=8
small="--set data.global_batch_tokens=2048 --set data.micro_batch_tokens=1024"
configs=(
  "single|1|demo|$small"
  "bf16|1|demo|$small --set train.precision=bf16"
  "tp2-pp2|4|demo|$small --set parallel.tp=2 --set parallel.pp=2"
  "hdp2-rings-offload|2|long|--set parallel.hdp=2 --set data.max_seq_len=2048 --set data.global_batch_tokens=4096 --set data.micro_batch_tokens=512"
  "balance-hdp2|2|long|--set parallel.hdp=2 --set scheduler.policy=balance --set data.max_seq_len=1024 --set data.global_batch_tokens=4096 --set data.micro_batch_tokens=512 --set offload.enabled=false"
  "tp2-pp2-hdp2|8|demo|$small --set parallel.tp=2 --set parallel.pp=2 --set parallel.hdp=2"
)

if [ "$list" = 1 ]; then
  for c in "${configs[@]}"; do IFS='|' read -r name ranks corpus overrides <<< "$c"; echo "$name ($ranks ranks, $corpus corpus): $overrides"; done
  exit 0
fi
[ -x "$trainer" ] || { echo "regression.sh: no trainer binary at $trainer (build it, or pass --trainer)" >&2; exit 2; }
if [ -n "$only" ]; then
  for want in ${only//,/ }; do
    printf '%s\n' "${configs[@]}" | grep -q "^$want|" || { echo "regression.sh: --only names an unknown configuration '$want' (see --list)" >&2; exit 2; }
  done
fi
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
work="$(cd "$work" && pwd)"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1

corpus_path() {
  local file="$work/corpus-$1.h5"
  if [ ! -e "$file" ]; then
    case "$1" in
      demo) "$trainer" make-corpus --output "$file" --documents 400 > "$work/corpus-$1.log" 2>&1 ;;
      long) "$trainer" make-corpus --output "$file" --documents 400 --max-length 6000 --seed 7 > "$work/corpus-$1.log" 2>&1 ;;
    esac || { cat "$work/corpus-$1.log" >&2; return 1; }
  fi
  echo "$file"
}

# step, loss, grad_norm, tokens_per_s of a metrics.jsonl, tab-separated.
metrics_table() {
  awk '{
    step = loss = grad = tps = "";
    if (match($0, /"step": *[-0-9.e+]+/)) { step = substr($0, RSTART, RLENGTH); sub(/.*: */, "", step) }
    if (match($0, /"loss": *[-0-9.e+]+/)) { loss = substr($0, RSTART, RLENGTH); sub(/.*: */, "", loss) }
    if (match($0, /"grad_norm": *[-0-9.e+]+/)) { grad = substr($0, RSTART, RLENGTH); sub(/.*: */, "", grad) }
    if (match($0, /"tokens_per_s": *[-0-9.e+]+/)) { tps = substr($0, RSTART, RLENGTH); sub(/.*: */, "", tps) }
    print step "\t" loss "\t" grad "\t" tps
  }' "$1"
}

# compare GOLDEN RUN LOSS_RTOL GRAD_RTOL: a run's table against its golden; prints
# "loss_err grad_err tps golden_tps verdict".
compare() {
  awk -F'\t' -v lt="$3" -v gt="$4" -v tf="$throughput_factor" -v steps="$steps" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
    FNR == NR { if ($1 ~ /^[0-9]+$/) { gl[$1] = $2; gg[$1] = $3; gt_[$1] = $4 } next }
    { rl[$1] = $2; rg[$1] = $3; rt[$1] = $4 }
    END {
      bad = ""; le = 0; ge = 0; ts = 0; tn = 0; gs = 0
      for (s = 1; s <= steps; s++) {
        if (!(s in gl)) { bad = bad " golden-lacks-step-" s; continue }
        if (!(s in rl) || rl[s] == "") { bad = bad " run-lacks-step-" s; continue }
        e = rel(rl[s], gl[s]); if (e > le) le = e
        e = rel(rg[s], gg[s]); if (e > ge) ge = e
        if (s > 1) { ts += rt[s]; gs += gt_[s]; tn++ }   # step 1 warms up
      }
      if (le > lt) bad = bad " loss"
      if (ge > gt) bad = bad " grad_norm"
      tps = tn ? ts / tn : 0; gtps = tn ? gs / tn : 0
      verdict = bad == "" ? "ok" : "FAIL(" substr(bad, 2) ")"
      if (bad == "" && gtps > 0 && tps < gtps / tf) verdict = "SLOW"
      printf "%.2e %.2e %.0f %.0f %s\n", le, ge, tps, gtps, verdict
    }' "$1" "$2"
}

cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: *//' || echo unknown)"
failed=0
rows=()
for c in "${configs[@]}"; do
  IFS='|' read -r name ranks corpus overrides <<< "$c"
  if [ -n "$only" ] && ! [[ ",$only," == *",$name,"* ]]; then continue; fi
  if [ "$ranks" -gt "$max_ranks" ]; then
    rows+=("$(printf '%-20s %5s  %-9s %-9s %9s %9s  %s' "$name" "$ranks" - - - - "skipped (needs $ranks ranks; --max-ranks $max_ranks)")")
    continue
  fi
  data="$(corpus_path "$corpus")"
  run_dir="$work/$name"
  rm -rf "$run_dir"
  # shellcheck disable=SC2206
  args=("$root/configs/tiny-llama.yaml" --set "data.path=$data" --set train.steps=$steps --set train.log_every=1
        --set train.checkpoint_every=0 --set train.resume=never --set train.threads=1 --set train.peak_flops=1e12
        --set "train.run_dir=$run_dir" $overrides)
  if [ "$ranks" = 1 ]; then
    launch=("$trainer" train)
  else
    launch=(mpirun --oversubscribe -np "$ranks" "$trainer" train)
  fi
  if ! "${launch[@]}" "${args[@]}" > "$work/$name.log" 2>&1; then
    tail -15 "$work/$name.log" >&2
    rows+=("$(printf '%-20s %5s  %-9s %-9s %9s %9s  %s' "$name" "$ranks" - - - - "FAIL(run failed: $work/$name.log)")")
    failed=1
    continue
  fi
  golden="$golden_dir/$name.tsv"
  if [ "$update" = 1 ]; then
    mkdir -p "$golden_dir"
    {
      echo "# scripts/regression.sh golden for '$name': tiny-llama, $ranks rank(s), $steps steps, one thread per rank"
      echo "# overrides: $overrides"
      echo "# written on: $cpu, $(date -u +%Y-%m-%d)"
      printf 'step\tloss\tgrad_norm\ttokens_per_s\n'
      metrics_table "$run_dir/metrics.jsonl"
    } > "$golden"
  fi
  if [ ! -e "$golden" ]; then
    rows+=("$(printf '%-20s %5s  %-9s %-9s %9s %9s  %s' "$name" "$ranks" - - - - "FAIL(no golden $golden; run with --update)")")
    failed=1
    continue
  fi
  if [[ "$overrides" == *train.precision=bf16* ]]; then lt="${loss_rtol:-1e-4}" gt="${grad_rtol:-1e-2}"
  else lt="${loss_rtol:-1e-5}" gt="${grad_rtol:-1e-4}"; fi
  read -r loss_err grad_err tps golden_tps verdict < <(compare "$golden" <(metrics_table "$run_dir/metrics.jsonl") "$lt" "$gt")
  rows+=("$(printf '%-20s %5s  %-9s %-9s %9s %9s  %s' "$name" "$ranks" "$loss_err" "$grad_err" "$tps" "$golden_tps" "$verdict")")
  case "$verdict" in
    ok) ;;
    SLOW) [ "$fail_slow" = 1 ] && failed=1 ;;
    *) failed=1 ;;
  esac
done

printf '%-20s %5s  %-9s %-9s %9s %9s  %s\n' config ranks loss_err grad_err "tok/s" "golden" result
printf '%s\n' "${rows[@]}"
echo "tolerances: loss ${loss_rtol:-1e-5 (bf16 1e-4)}, grad_norm ${grad_rtol:-1e-4 (bf16 1e-2)} (max relative error over $steps steps); tok/s: mean of steps 2..$steps, SLOW below golden / $throughput_factor"
[ "$update" = 1 ] && echo "goldens rewritten in $golden_dir: review them with git diff before committing"
exit "$failed"
