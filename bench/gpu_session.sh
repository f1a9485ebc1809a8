#!/usr/bin/env bash
# One sitting on a lent GPU machine, run from the repository root: proves the CUDA
# backend and measures it, writing every log under OUTDIR and ending with one
# summary table (check, figure, target, pass) in OUTDIR/summary.txt, rewritten after
# every row. A step that fails or runs out of its time limit is marked so and the
# next one runs: one sitting gives the whole picture. About 5-6 minutes on an H100
# with every step. The steps run in the order below, the checks and figures that
# matter most first (selftest, the losses, the bf16 bench with both attentions,
# PyTorch's baseline), so that a sitting short of time loses the optional ones:
#   selftest  trainer selftest: every op in fp32, TF32 and bf16 against the CPU
#             backend, and training steps in fp32 and bf16 (all must pass)
#   losses    tiny-llama, the first 5 losses on the GPU (fp32) against the CPU (1e-4)
#   bf16      tiny-llama in bf16: the first 5 losses on the GPU against the CPU's
#             bf16 (1e-3); later (after pytorch) 200 steps on the GPU in bf16 against
#             fp32 (the mean loss of the last 10 steps within 2%, as
#             tests/training_bf16_test.cpp asks of the CPU)
#   bench     bench-llama-1b (4 x 4096-token sequences a step) as configured (bf16,
#             attention auto: cuDNN's), bf16 with our attention (train.attention own), then TF32
#             (a figure beside them, no target): medians
#             of steps 3..10 of tokens/s, MFU (model FLOPs / 989 TFLOP/s, the H100's
#             dense BF16 peak; target 50% in bf16) and peak memory; for bf16 also
#             busy_ms (device time from events, read at the step's end) against the step
#   pytorch   the same shape in Hugging Face LlamaForCausalLM, bf16 autocast, eager and
#             torch.compile (when torch and transformers import)
#   optimes   bench-llama-1b as configured, device time per op of the steps after the
#             first (HDP_CUDA_OP_TIMES=1; the GEMMs by shape, with TFLOP/s)
#   nccl      the communicator conformance suite on a one-rank NCCL communicator
#             (needs bin/mpi_communicator_conformance_test in the bundle)
#   recompute bench-llama-1b in bf16 with train.recompute selective and full (every
#             layer): tokens/s, MFU, step time and peak memory beside the bench step's
#             bf16 row without recomputation (issue 25's GPU figures)
#
#   bench/gpu_session.sh BUNDLE OUTDIR [steps...]   (default: all; always in this order)
# BUNDLE is a directory made by scripts/bundle.sh from a CUDA build (bench/gpu_check.sh
# unpacks the carried archive and calls this). CUDA's own libraries are taken from
# the system or, failing that, from a PyTorch installation's nvidia-* wheels.
# HDP_GPU_DEADLINE (seconds since the epoch): no run starts with less than 30 s left
# before it (a "skipped: out of time" row instead) and none runs past it.
# HDP_GPU_RESULTS (a directory, e.g. the device's $OUT): where summary.txt and
# logs.tar.gz are copied after every row, so a sitting killed from outside still
# leaves what finished.
set -uo pipefail
bundle="$(cd "$1" && pwd)"
out="$2"
shift 2
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(selftest losses bf16 bench pytorch optimes nccl recompute)
mkdir -p "$out"
out="$(cd "$out" && pwd)"
has_step() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
trainer() { "$bundle/run.sh" "$@"; }
run_trainer="$bundle/run.sh"  # what run_logged runs (timeout runs programs, not shell functions)
echo "CUDA libraries from: ${cuda_dirs:-the system}"
timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"

deadline="${HDP_GPU_DEADLINE:-}"
results="${HDP_GPU_RESULTS:-}"
min_left=30  # seconds: less is too little for any run to say something
# seconds_left: seconds to the deadline (a day without one).
seconds_left() { if [ -n "$deadline" ]; then echo $(( deadline - $(date +%s) )); else echo 86400; fi; }

# The summary: one tab-separated row per check, shown as a table (with `|` between
# the columns where the image has no `column`).
summary="$out/summary.tsv"
printf 'check\tfigure\ttarget\tpass\n' > "$summary"
table() {
  if command -v column >/dev/null; then column -t -s $'\t' "$summary"; else tr '\t' '|' < "$summary"; fi
}
# publish: the table so far to OUTDIR/summary.txt and, with HDP_GPU_RESULTS, it and
# every log to there (written aside and renamed, so a kill never leaves half a file).
publish() {
  table > "$out/summary.txt"
  [ -n "$results" ] || return 0
  cp "$out/summary.txt" "$results/summary.txt.part" && mv -f "$results/summary.txt.part" "$results/summary.txt"
  tar -C "$(dirname "$out")" -czf "$results/logs.tar.gz.part" "$(basename "$out")" &&
    mv -f "$results/logs.tar.gz.part" "$results/logs.tar.gz"
}
# An empty field would merge with the next under `column`: "-" stands in for it.
record() { printf '%s\t%s\t%s\t%s\n' "${1:--}" "${2:--}" "${3:--}" "${4:--}" >> "$summary"; publish; }
# begin_step STEP [PART]: whether to run STEP (or that part of it): asked for, and
# time left (else a row says so).
begin_step() {
  has_step "$1" || return 1
  local left
  left=$(seconds_left)
  [ "$left" -ge "$min_left" ] && return 0
  record "step $1${2:+ ($2)}" "skipped: out of time (${left}s left)" "-" "skipped"
  return 1
}
# run_logged SECONDS LOG COMMAND...: the command under a time limit (cut to the time
# left before the deadline), its output in LOG; prints "timed out" or "exit N" for a
# failure and returns its status. With under min_left seconds left it runs nothing,
# records a "skipped: out of time" row and returns 125.
run_logged() {
  local limit="$1" log="$2" left
  shift 2
  left=$(seconds_left)
  if [ "$left" -lt "$min_left" ]; then
    echo "skipped: out of time (${left}s left)" | tee "$log"
    local name="${log##*/}"
    record "run ${name%.*}" "skipped: out of time (${left}s left)" "-" "skipped"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "timed out after ${limit}s (log: $log)"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && echo "exit $rc (log: $log)"
  return $rc
}
losses() { grep -o '"loss": *[0-9.e+-]*' "$1" 2>/dev/null | sed 's/.*: *//'; }
# max_rel A B: the largest relative difference of two loss lists (one per line), or
# "missing" when either is empty or they differ in length.
max_rel() {
  paste <(losses "$1") <(losses "$2") |
    awk -F'\t' 'NF < 2 || $1 == "" || $2 == "" {bad = 1; next}
                {r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > m) m = r; n++}
                END {if (bad || n == 0) print "missing"; else printf "%.2e\n", m}'
}
within() { [ "$1" != missing ] && awk -v a="$1" -v b="$2" 'BEGIN {exit !(a + 0 <= b + 0)}'; }
verdict() { if within "$1" "$2"; then echo yes; else echo NO; fi; }

common=(--set train.log_every=1 --set train.checkpoint_every=0 --set train.resume=never)
# Every run directory is removed before its run: runs/ outlives a call on a warm
# machine, and a run that dies at start-up must not leave the last call's metrics
# to be read as its own. The CPU references are reused within this sitting only.
rm -rf runs/t5-cpu-fp32 runs/t5-cpu-bf16
if has_step losses || has_step bf16; then
  mkdir -p data-cache
  [ -f data-cache/demo-corpus.h5 ] || trainer make-corpus --output data-cache/demo-corpus.h5 >/dev/null 2>&1
fi

if begin_step selftest; then
  echo "== selftest"
  run_logged 150 "$out/selftest.txt" "$run_trainer" selftest
  rc=$?
  tail -3 "$out/selftest.txt"
  line="$(grep -Eo '[0-9]+ passed, [0-9]+ failed' "$out/selftest.txt" | tail -1)"
  # Without a usable GPU selftest checks nothing and exits 0: a pass needs its count line.
  record "trainer selftest (fp32, TF32, bf16, training steps)" "${line:-no summary line}" "all pass" \
    "$([ $rc -eq 0 ] && [[ "$line" == *" 0 failed" ]] && echo yes || echo NO)"
fi

# first5 NAME PRECISION LIMIT TAG [GPU SETTINGS...]: the first 5 losses of tiny-llama
# on the CPU and on the GPU (with the settings; TAG names the GPU run's files).
first5() {
  local name="$1" precision="$2" limit="$3" tag="$4"
  shift 4
  echo "== tiny-llama, first 5 losses, CPU vs GPU ($tag)"
  local cpu=runs/t5-cpu-$precision gpu=runs/t5-gpu-$tag
  if [ ! -f $cpu/metrics.jsonl ]; then
    rm -rf $cpu
    run_logged 90 "$out/t5-cpu-$precision.log" "$run_trainer" train configs/tiny-llama.yaml "${common[@]}" \
      --set train.steps=5 --set train.precision="$precision" --set train.run_dir=$cpu
  fi
  rm -rf $gpu
  run_logged 90 "$out/t5-gpu-$tag.log" "$run_trainer" train configs/tiny-llama.yaml "${common[@]}" \
    --set train.steps=5 --set train.precision="$precision" --set train.run_dir=$gpu --set train.device=cuda "$@"
  paste <(losses $cpu/metrics.jsonl) <(losses $gpu/metrics.jsonl) | tee "$out/t5-$tag-compare.txt"
  local m
  m="$(max_rel $cpu/metrics.jsonl $gpu/metrics.jsonl)"
  record "$name" "max relative difference $m" "<= $limit" "$(verdict "$m" "$limit")"
}
begin_step losses && first5 "tiny-llama 5 losses, GPU fp32 vs CPU fp32" fp32 1e-4 fp32

if begin_step bf16; then
  # Both round the same fp32 values to bf16; summation order can move a value across a
  # rounding boundary (a bf16 step, 2^-8), which later steps carry: 1e-3, not fp32's 1e-4.
  first5 "tiny-llama 5 losses, GPU bf16 vs CPU bf16" bf16 1e-3 bf16 --set train.attention=own
  first5 "tiny-llama 5 losses, GPU bf16 (cuDNN attention) vs CPU bf16" bf16 1e-3 bf16-cudnn \
    --set train.attention=cudnn
fi

if has_step bench || has_step optimes || has_step recompute; then
  # Documents of exactly 4096 tokens (4095 bytes + BOS): every micro-batch is one
  # full causal 4096-token sequence, the work the PyTorch baseline does.
  mkdir -p data-cache
  [ -f data-cache/bench-4096.h5 ] || trainer make-corpus --output data-cache/bench-4096.h5 --documents 400 \
    --min-length 4095 --median-length 4095 --max-length 4095 >/dev/null 2>&1
fi
if has_step bench || has_step recompute; then
  # NAME then settings: 10 steps; medians of steps 3..10 (the first two include start-up
  # work) of tokens/s, MFU, step time and the device memory of all arenas.
  bench_run() {
    local name="$1"
    shift
    echo "== bench-llama-1b, $name"
    rm -rf runs/b1b-$name
    run_logged 150 "$out/bench-1b-$name.log" "$run_trainer" train configs/bench-llama-1b.yaml \
      --set data.path=data-cache/bench-4096.h5 --set train.steps=10 --set train.run_dir=runs/b1b-$name "$@"
    local m=runs/b1b-$name/metrics.jsonl
    paste <(grep -o '"tokens_per_s": [0-9.]*' $m 2>/dev/null | sed 's/.*: //') \
          <(grep -o '"mfu": [0-9.]*' $m 2>/dev/null | sed 's/.*: //') \
          <(grep -o '"step_ms": [0-9.]*' $m 2>/dev/null | sed 's/.*: //') \
          <(grep -o '"peak_mem_bytes": [0-9]*' $m 2>/dev/null | sed 's/.*: //') | tail -n +3 |
      awk '{t[NR] = $1; u[NR] = $2; s[NR] = $3; p = $4}
           function med(a, n,   i, j, x) {for (i = 2; i <= n; i++) {x = a[i]; for (j = i - 1; j > 0 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x} return a[int((n + 1) / 2)]}
           END {if (NR == 0) {print "missing"; exit}
                printf "%.0f %.4f %.0f %.1f\n", med(t, NR), med(u, NR), med(s, NR), p / 1e9}' > "$out/bench-1b-$name.median"
    local tps mfu step_ms mem
    read -r tps mfu step_ms mem < "$out/bench-1b-$name.median"
    echo "$name: ${tps:-?} tokens/s, MFU ${mfu:-?}, step ${step_ms:-?} ms, peak ${mem:-?} GB"
    if [ "$name" = bf16 ]; then
      # busy_ms is device time from events recorded around each forward and backward and
      # read after the step's one read-back (no synchronize inside the step): above 0, and
      # at most the step on one GPU.
      local busy
      busy="$(grep -o '"busy_ms_max": [0-9.]*' $m 2>/dev/null | sed 's/.*: //' | tail -n +3 | sort -g |
        awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]}')"
      record "bench-llama-1b bf16: busy_ms from device events (median of steps 3-10)" \
        "${busy:-missing} ms of a ${step_ms:-?} ms step" "0 < busy <= step" \
        "$(awk -v b="${busy:-0}" -v s="${step_ms:-0}" 'BEGIN {print (b > 0 && b <= s) ? "yes" : "NO"}')"
    fi
    if [[ "$name" == bf16* && "$name" != *recompute* ]]; then
      record "bench-llama-1b $name: MFU (median of steps 3-10)" \
        "${mfu:-missing} (${tps:-?} tokens/s, ${step_ms:-?} ms, ${mem:-?} GB)" ">= 0.50" \
        "$([ "${tps:-missing}" != missing ] && awk -v m="${mfu:-0}" 'BEGIN {print (m >= 0.5) ? "yes" : "NO"}' || echo NO)"
    else
      record "bench-llama-1b $name: MFU (median of steps 3-10)" \
        "${mfu:-missing} (${tps:-?} tokens/s, ${step_ms:-?} ms, ${mem:-?} GB)" "-" \
        "$([ "${tps:-missing}" != missing ] && echo ran || echo NO)"
    fi
  }
fi
if begin_step bench; then
  # The config as a user runs it: bf16 (the default on cuda) with train.attention
  # auto (cuDNN's fused attention where it takes the call); then our attention
  # kernels (bf16 tensor cores, mma m16n8k16) in its place.
  bench_run bf16
  bench_run bf16-own --set train.attention=own
  # TF32 last: a figure beside the bf16 rows, with no target of its own.
  bench_run tf32 --set train.precision=fp32 --set train.tf32=true
fi
if begin_step pytorch; then
  # PyTorch loads the CUDA libraries of its own nvidia-* wheels; those gpu_env.sh put
  # first on LD_LIBRARY_PATH for our binaries (the toolkit's, maybe another version)
  # could shadow them, so it runs with the path as the machine had it.
  torch_env=(env -u LD_LIBRARY_PATH)
  [ -n "$system_ld_library_path" ] && torch_env=(env LD_LIBRARY_PATH="$system_ld_library_path")
  if "${torch_env[@]}" python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "== PyTorch + transformers baseline, bf16, eager and torch.compile"
    PYTHONUNBUFFERED=1 run_logged 240 "$out/pytorch.txt" "${torch_env[@]}" python3 bench/pytorch_llama_baseline.py \
      --precisions bf16 --steps 5 --compile
    rc=$?
    grep -v Warning "$out/pytorch.txt" | tail -6
    record "PyTorch LlamaForCausalLM bf16, eager and compiled (pytorch.txt)" \
      "$(grep -iE 'mfu' "$out/pytorch.txt" | tail -2 | tr '\n' ';' | tr '\t' ' ')" "-" "$([ $rc -eq 0 ] && echo ran || echo NO)"
  else
    record "PyTorch baseline" "torch or transformers does not import" "-" "skipped"
  fi
fi
# bf16's 200 steps, after the figures that matter more: tiny-llama's 400 steps are
# the longest runs of the step.
if begin_step bf16 "200 steps"; then
  echo "== tiny-llama, 200 steps on the GPU, bf16 vs fp32"
  for precision in fp32 bf16; do
    rm -rf runs/t200-gpu-$precision
    run_logged 120 "$out/t200-gpu-$precision.log" "$run_trainer" train configs/tiny-llama.yaml "${common[@]}" \
      --set train.run_dir=runs/t200-gpu-$precision --set train.device=cuda --set train.precision=$precision
  done
  # As tests/training_bf16_test.cpp judges the CPU's curves: the mean of the last 10
  # steps, and every 10-step window of bf16 against the closest fp32 window at most 5
  # steps away (rounding shifts the fall of the loss by a few steps).
  paste <(losses runs/t200-gpu-fp32/metrics.jsonl) <(losses runs/t200-gpu-bf16/metrics.jsonl) |
    awk '{a[NR] = $1; b[NR] = $2; n = NR}
         function w(x, e,   i, s) {s = 0; for (i = e - 9; i <= e; i++) s += x[i]; return s / 10}
         function rel(x, y) {return (x > y ? x - y : y - x) / y}
         END {if (n < 200) {print "missing"; exit}
              worst = 0
              for (s = 10; s <= n; s += 10) {
                c = 1e9
                for (e = (s - 5 < 10 ? 10 : s - 5); e <= (s + 5 > n ? n : s + 5); e++) if (rel(w(b, s), w(a, e)) < c) c = rel(w(b, s), w(a, e))
                if (c > worst) {worst = c; at = s}}
              printf "%.4f %.4f %.2e %.2e %d\n", w(a, n), w(b, n), rel(w(b, n), w(a, n)), worst, at}' > "$out/t200-tail.txt"
  read -r fp32_tail bf16_tail rel worst at < "$out/t200-tail.txt"
  record "tiny-llama 200 steps on the GPU, bf16 vs fp32 (mean loss of steps 191-200)" \
    "fp32 ${fp32_tail:-?}, bf16 ${bf16_tail:-?}, relative ${rel:-missing}" "<= 2e-2" "$(verdict "${rel:-missing}" 2e-2)"
  record "tiny-llama 200 steps on the GPU, bf16 vs fp32 (worst 10-step window, shift <= 5)" \
    "${worst:-missing} (steps $(( ${at:-10} - 9 ))-${at:-?})" "<= 2e-2" "$(verdict "${worst:-missing}" 2e-2)"
  ms="$(grep -o '"step_ms": *[0-9.]*' runs/t200-gpu-bf16/metrics.jsonl 2>/dev/null | tail -1 | sed 's/.*: *//')"
  record "tiny-llama bf16 step time on the GPU" "${ms:-?} ms" "-" "-"
fi

if begin_step optimes; then
  echo "== bench-llama-1b as configured (bf16, cuDNN's attention), device time per op (HDP_CUDA_OP_TIMES=1, 4 steps)"
  rm -rf runs/b1b-times-bf16
  HDP_CUDA_OP_TIMES=1 run_logged 120 "$out/bench-1b-op-times-bf16.log" "$run_trainer" train configs/bench-llama-1b.yaml \
    --set data.path=data-cache/bench-4096.h5 --set train.steps=4 --set train.run_dir=runs/b1b-times-bf16
  rc=$?
  sed -n '/device time per op/,/timed total/p' "$out/bench-1b-op-times-bf16.log" | tee "$out/op-times-bf16.txt" | head -40
  record "device time per op, bf16 (op-times-bf16.txt)" "$(wc -l < "$out/op-times-bf16.txt") lines" "-" \
    "$([ $rc -eq 0 ] && echo ran || echo NO)"
fi
if begin_step nccl; then
  if [ -x "$bundle/bin/mpi_communicator_conformance_test" ]; then
    echo "== communicator conformance on one rank, NCCL included"
    run_logged 120 "$out/nccl-conformance.txt" "$bundle/mpirun.sh" -np 1 "$bundle/run.sh" \
      --bin mpi_communicator_conformance_test --gtest_color=no
    rc=$?
    tail -4 "$out/nccl-conformance.txt"
    c="$out/nccl-conformance.txt"
    passed="$(grep -oE '^\[  PASSED  \] [0-9]+' "$c" | grep -oE '[0-9]+$')"
    skipped="$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?,' "$c" | grep -oE '[0-9]+')"
    nccl_ok="$(grep -cE '^\[       OK \] Nccl/' "$c")"
    record "communicator conformance, one rank (MPI, CUDA staging, NCCL)" \
      "${passed:-0} passed (NCCL ${nccl_ok}), ${skipped:-0} skipped (need 2+ ranks)" "all pass, NCCL cases ran" \
      "$([ $rc -eq 0 ] && [ "$nccl_ok" -gt 0 ] && echo yes || echo NO)"
  else
    record "communicator conformance, one rank" "bin/mpi_communicator_conformance_test not in the bundle" "-" "skipped"
  fi
fi

if begin_step recompute; then
  # The recomputation modes at the bench shape: the rerun's cost (step time) and what it
  # saves (peak memory), against the bench step's bf16 row.
  for mode in selective full; do
    bench_run bf16-recompute-$mode --set train.precision=bf16 --set train.tf32=true --set train.recompute=$mode
  done
fi

publish
echo
echo "== summary (also $out/summary.txt)"
table
