#!/usr/bin/env bash
# Every parallel layout on the GPU, run from the repository root: tiny-llama for 5
# fp32 steps with train.device=cuda on one rank, then on 2 ranks (which share the
# machine's GPU(s): each rank takes GPU local_rank mod the visible count) under
#   tp2   tensor parallel (vocabulary-parallel cross-entropy on the device)
#   pp2   two pipeline stages (1F1B)
#   hdp2  hybrid data parallel (ZeRO-1 reduce-scatter / all-gather)
#   long  hdp4 on documents up to 2048 tokens, 512 per rank and micro-batch: ring
#         attention across the ranks and activation offload (the set-up of
#         tests/training_parallel_test.cpp HybridDataParallel.LongDocuments...),
#         against its own single-rank run (micro_batch_tokens 2048, no ring)
# and prints each layout's first 5 losses beside the single rank's, the largest
# relative difference and whether it is within 1e-4. In these cases device buffers
# cross ranks through the MPI communicator's pinned host staging (parallel.comm=mpi).
# The NCCL communicator (parallel/nccl_communicator.h), compiled only until a GPU
# session runs this:
#   conformance  the communicator conformance suite (tests/communicator_conformance.h)
#                on NCCL and on MPI with CUDA buffers, on 1 rank and on 2 ranks
#                sharing the GPU(s): NCCL forms groups only of ranks with a GPU of
#                their own (one GPU: NCCL groups of 1 only; MPI uses both ranks)
#   nccl1        one rank with parallel.comm=nccl (world size 1: the NCCL
#                communicators exist but every group has one rank) against `single`
#   tp2-nccl pp2-nccl hdp2-nccl long-nccl
#                the layouts above with parallel.comm=nccl; they need a GPU per rank
#                and are reported as skipped (not failed) on a machine with fewer;
#                hdp2-nccl also traces a step and counts its device-* records (the
#                NCCL operations timed by events on their stream, parallel/device_ops.h)
#   ring-bench   bench/ring_exchange_bench (ring attention's K/V exchange: bytes/s per
#                rank and the share hidden behind the block attention) on 2 ranks with
#                CUDA buffers over MPI, and over NCCL on 2 and 4 ranks where there are
#                as many GPUs (skipped otherwise); its tables go to the summary
#
#   bench/gpu_parallel_check.sh BUNDLE OUTDIR [cases...]
# BUNDLE is a directory made by scripts/bundle.sh from a CUDA build; for the
# conformance and ring-bench cases it must hold those programs too:
#   scripts/bundle.sh BUNDLE build/trainer/trainer build/tests/mpi_communicator_conformance_test \
#       build/bench/ring_exchange_bench
# (ring-bench is reported as skipped when the bundle has no bin/ring_exchange_bench).
# Cases default to "tp2 pp2 hdp2 long conformance nccl1 tp2-nccl pp2-nccl hdp2-nccl
# long-nccl ring-bench". Each run has 120 s. OUTDIR (e.g. the device's $OUT, which
# brings back at most 8 files) receives summary.txt, written as the cases run, and
# logs.tar.gz, every run's log (kept in /tmp/hdp-gpc-logs), packed again after each
# case, so a call killed at its limit still brings back what finished. Run
# directories go to runs/gpc-*, removed first. Exit status: 0 when every case ran (or was skipped for want of
# GPUs) and is within 1e-4, 1 otherwise. HDP_CHECK_DEVICE=cpu runs the same checks
# on the CPU (to try the script on a machine without a GPU; the NCCL cases then
# fail at start-up with exit 2, as parallel.comm=nccl on train.device cpu must).
set -uo pipefail
bundle="$(cd "$1" && pwd)"
results="$2"
shift 2
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(tp2 pp2 hdp2 long conformance nccl1 tp2-nccl pp2-nccl hdp2-nccl long-nccl ring-bench)
out=/tmp/hdp-gpc-logs  # the runs' logs, packed into $results/logs.tar.gz
rm -rf "$out"
mkdir -p "$out" "$results"
run_limit=120  # seconds for one run: tiny-llama's 5 steps take a few seconds
# runs/ outlives a call on a warm machine: a run that dies at start-up (or the long1
# reference long-nccl reuses) must not be read from the last call.
rm -rf runs/gpc-*

source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
trainer() { "$bundle/run.sh" "$@"; }
summary="$results/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
# pack_logs: every log so far into $results/logs.tar.gz (written aside and renamed).
pack_logs() {
  tar -C "$(dirname "$out")" -czf "$results/logs.tar.gz.part" "$(basename "$out")" &&
    mv -f "$results/logs.tar.gz.part" "$results/logs.tar.gz"
}
say "CUDA libraries from: ${cuda_dirs:-the system}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$summary"

mkdir -p data-cache
[ -f data-cache/demo-corpus.h5 ] || trainer make-corpus --output data-cache/demo-corpus.h5 >/dev/null 2>&1
if [[ " ${cases[*]} " == *" long "* ]] && [ ! -f data-cache/long-corpus.h5 ]; then
  trainer make-corpus --output data-cache/long-corpus.h5 --documents 400 --max-length 6000 --seed 7 >/dev/null 2>&1
fi

common=(configs/tiny-llama.yaml --set train.steps=5 --set train.device="${HDP_CHECK_DEVICE:-cuda}" --set train.precision=fp32 --set train.tf32=false
        --set train.log_every=1 --set train.checkpoint_every=0 --set train.resume=never)
# How many GPUs this machine has (0 without nvidia-smi): the NCCL layouts need one per rank.
gpus="$(nvidia-smi --list-gpus 2>/dev/null | grep -c "^GPU" || true)"
long_data=(--set data.path=data-cache/long-corpus.h5 --set data.max_seq_len=2048 --set data.global_batch_tokens=6144)

losses() {  # the loss of every step in a metrics.jsonl
  grep -o '"loss": *[0-9.e+-]*' "$1" 2>/dev/null | sed 's/.*: *//'
}

# run NAME RANKS ARGS...: one training run, its log in OUTDIR/NAME.log, runs/gpc-NAME.
run() {
  local name="$1" n="$2"
  shift 2
  rm -rf "runs/gpc-$name"
  local args=(train "${common[@]}" --set train.run_dir="runs/gpc-$name" --set train.checkpoint_dir="runs/gpc-$name/ckpt" "$@")
  local rc
  if [ "$n" -eq 1 ]; then
    timeout --kill-after=10 "$run_limit" "$bundle/run.sh" "${args[@]}" > "$out/$name.log" 2>&1
  else
    timeout --kill-after=10 "$run_limit" "$bundle/mpirun.sh" --oversubscribe -np "$n" "$bundle/run.sh" "${args[@]}" > "$out/$name.log" 2>&1
  fi
  rc=$?
  grep -h 'GPU [0-9]* of [0-9]* visible' "$out/$name.log" | sed 's/.*\] *//' | sort -u | sed 's/^/  /' | tee -a "$summary"
  if [ $rc -ne 0 ]; then
    say "  $name: exit $rc; last lines of $out/$name.log:"
    tail -5 "$out/$name.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  return $rc
}

# compare NAME REF: the 5 losses side by side, the largest relative difference.
failed=0
compare() {
  local name="$1" ref="$2"
  local a b
  a="$(losses "runs/gpc-$ref/metrics.jsonl" | head -5)"
  b="$(losses "runs/gpc-$name/metrics.jsonl" | head -5)"
  if [ "$(echo "$a" | grep -c .)" -ne 5 ] || [ "$(echo "$b" | grep -c .)" -ne 5 ]; then
    say "  $name: fewer than 5 losses (reference $(echo "$a" | grep -c .), $name $(echo "$b" | grep -c .)): FAILED"
    failed=1
    return
  fi
  paste <(echo "$a") <(echo "$b") |
    awk -v name="$name" '{r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > m) m = r;
                           printf "  step %d  1 rank %.7f  %-5s %.7f  rel %.2e\n", NR, $1, name, $2, r}
         END {printf "  %s: max relative difference %.2e (%s 1e-4)\n", name, m, m <= 1e-4 ? "within" : "ABOVE";
              exit m <= 1e-4 ? 0 : 1}' | tee -a "$summary"
  [ "${PIPESTATUS[1]}" -eq 0 ] || failed=1
}

say "== 1 rank (reference)"
run single 1 || failed=1
pack_logs
for c in "${cases[@]}"; do
  case "$c" in
    tp2)  say "== tp2 (2 ranks)";  run tp2 2 --set parallel.tp=2 --set parallel.comm=mpi && compare tp2 single || failed=1 ;;
    pp2)  say "== pp2 (2 ranks)";  run pp2 2 --set parallel.pp=2 --set parallel.comm=mpi && compare pp2 single || failed=1 ;;
    hdp2) say "== hdp2 (2 ranks)"; run hdp2 2 --set parallel.hdp=2 --set parallel.comm=mpi && compare hdp2 single || failed=1 ;;
    conformance)
      # Groups of 1 and 2 ranks; the test program prints why a backend or size is skipped.
      for n in 1 2; do
        say "== communicator conformance, $n rank(s): NCCL and MPI with CUDA buffers"
        timeout --kill-after=10 "$run_limit" "$bundle/mpirun.sh" --oversubscribe -np "$n" "$bundle/run.sh" \
          --bin mpi_communicator_conformance_test \
          --gtest_filter='Nccl/*:MpiCuda/*' > "$out/conformance-$n.log" 2>&1
        rc=$?
        grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$out/conformance-$n.log" | sort | uniq -c | sed 's/^/  /' | tee -a "$summary"
        if [ $rc -ne 0 ]; then
          say "  conformance on $n rank(s): exit $rc (log $out/conformance-$n.log)"
          failed=1
        fi
      done
      ;;
    nccl1) say "== 1 rank, parallel.comm=nccl"; run nccl1 1 --set parallel.comm=nccl && compare nccl1 single || failed=1 ;;
    tp2-nccl | pp2-nccl | hdp2-nccl)
      n=2
      degree="${c%-nccl}"
      if [ "$gpus" -lt "$n" ]; then
        say "== $c: skipped, $gpus GPU(s) for $n ranks (NCCL needs one per rank)"
      else
        say "== $c ($n ranks, NCCL)"
        trace=()
        [ "$c" = hdp2-nccl ] && trace=(--set trace.every=2 --set trace.steps=1)
        run "$c" "$n" --set "parallel.${degree%2}=2" --set parallel.comm=nccl "${trace[@]}" && compare "$c" single || failed=1
        if [ "$c" = hdp2-nccl ]; then
          # The NCCL collectives' device times, as the tracer records them (docs/tracing.md).
          device_records="$(cat runs/gpc-hdp2-nccl/trace/rank-*.jsonl 2>/dev/null | grep -c '"op":"device-')"
          say "  hdp2-nccl: $device_records device-* trace records (NCCL operations timed on their stream)"
          [ "$device_records" -gt 0 ] || failed=1
        fi
      fi
      ;;
    long-nccl)
      if [ "$gpus" -lt 4 ]; then
        say "== long-nccl: skipped, $gpus GPU(s) for 4 ranks (NCCL needs one per rank)"
      else
        [ -f runs/gpc-long1/metrics.jsonl ] || run long1 1 "${long_data[@]}" --set data.micro_batch_tokens=2048 || failed=1
        say "== long documents: hdp4 on NCCL, ring attention as grouped send/recv + offload (4 ranks)"
        run long-nccl 4 "${long_data[@]}" --set data.micro_batch_tokens=512 --set parallel.hdp=4 --set parallel.comm=nccl &&
          compare long-nccl long1 || failed=1
      fi
      ;;
    long)
      say "== long documents: 1 rank (reference, micro-batch 2048)"
      run long1 1 "${long_data[@]}" --set data.micro_batch_tokens=2048 || failed=1
      say "== long documents: hdp4, ring attention + offload (4 ranks, micro-batch 512)"
      if run long 4 "${long_data[@]}" --set data.micro_batch_tokens=512 --set parallel.hdp=4 --set parallel.comm=mpi; then
        compare long long1
        # Whether the sequences really went through the ring and host memory.
        for key in attention_bytes offloaded_bytes; do
          max="$(grep -o "\"$key\": *[0-9]*" runs/gpc-long/metrics.jsonl | sed 's/.*: *//' | sort -n | tail -1)"
          say "  long: largest $key per step ${max:-missing}"
          [ "${max:-0}" -gt 0 ] || failed=1
        done
      else
        failed=1
      fi
      ;;
    ring-bench)
      # bench/gpu_prepare.sh's bundle leaves the benchmarks out (HDP_BUILD_BENCH=OFF).
      if [ ! -x "$bundle/bin/ring_exchange_bench" ]; then
        say "== ring exchange bench: skipped, no bin/ring_exchange_bench in the bundle"
        pack_logs
        continue
      fi
      # mpi with CUDA buffers: staged through pinned host memory; nccl: one GPU per rank.
      for setting in "mpi 2" "nccl 2" "nccl 4"; do
        read -r comm n <<< "$setting"
        if [ "$comm" = nccl ] && [ "$gpus" -lt "$n" ]; then
          say "== ring exchange bench, $comm, $n ranks: skipped, $gpus GPU(s) (NCCL needs one per rank)"
          continue
        fi
        say "== ring exchange bench, $comm, $n ranks (bench-llama-1b's K/V blocks)"
        timeout --kill-after=10 "$run_limit" "$bundle/mpirun.sh" --oversubscribe -np "$n" "$bundle/run.sh" --bin ring_exchange_bench \
          --comm "$comm" --device "${HDP_CHECK_DEVICE:-cuda}" --tokens 4096,16384 > "$out/ring-bench-$comm-$n.log" 2>&1
        rc=$?
        sed 's/^/  /' "$out/ring-bench-$comm-$n.log" | tee -a "$summary"
        [ $rc -eq 0 ] || { say "  ring-bench $comm $n: exit $rc"; failed=1; }
      done
      ;;
    *) say "unknown case $c (tp2 pp2 hdp2 long conformance nccl1 tp2-nccl pp2-nccl hdp2-nccl long-nccl ring-bench)"; failed=1 ;;
  esac
  pack_logs
done
say "== $([ $failed -eq 0 ] && echo 'all layouts within 1e-4 of one rank' || echo 'SOME LAYOUTS FAILED or differ') (summary in $summary)"
exit $failed
