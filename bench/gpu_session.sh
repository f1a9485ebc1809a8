#!/usr/bin/env bash
# One sitting on a GPU machine, run from the repository root: proves the CUDA
# backend and measures it, writing every log under OUTDIR.
#   1. selftest: trainer selftest (every op in fp32 and bf16, and five training steps
#      in fp32 and in bf16, against the CPU backend)
#   2. losses: tiny-llama, the first 5 losses on the GPU (fp32) against the CPU
#   3. curve: tiny-llama, 200 steps in fp32 on the GPU, the loss curve beside the CPU's
#   4. bf16: tiny-llama in bf16 mixed precision: the first 5 losses on the GPU against
#      the CPU's bf16 (within 1e-3), then 200 steps on the GPU in bf16 against fp32
#      (the mean loss of the last 10 steps within 2%, as tests/training_bf16_test.cpp
#      asks of the CPU)
#   5. bench: bench-llama-1b, step time, tokens/s, MFU (model FLOPs / 989 TFLOP/s, the
#      H100's dense BF16 peak), peak memory: fp32, TF32, bf16 (attention on bf16
#      tensor cores); then device time per op for TF32 and bf16
#   6. pytorch: the same shape in Hugging Face LlamaForCausalLM (when importable)
#
#   bench/gpu_session.sh BUNDLE OUTDIR [steps...]   (default: all six in this order)
# BUNDLE is a directory made by scripts/bundle.sh from a CUDA build. CUDA's own
# libraries are taken from the system or, failing that, from a PyTorch
# installation's nvidia-* wheels.
set -uo pipefail
bundle="$(cd "$1" && pwd)"
out="$2"
shift 2
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(selftest losses curve bf16 bench pytorch)
mkdir -p "$out"
has_step() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
trainer() { "$bundle/run.sh" "$@"; }
echo "CUDA libraries from: ${cuda_dirs:-the system}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"

if has_step selftest; then
  echo "== selftest"
  trainer selftest 2>&1 | tee "$out/selftest.txt"
fi

losses() {  # the loss of every step in a metrics.jsonl
  grep -o '"loss": *[0-9.e+-]*' "$1" | sed 's/.*: *//'
}

if has_step losses || has_step curve || has_step bf16; then
  mkdir -p data-cache
  [ -f data-cache/demo-corpus.h5 ] || trainer make-corpus --output data-cache/demo-corpus.h5 >/dev/null 2>&1
fi
common=(--set train.log_every=1 --set train.checkpoint_every=0 --set train.resume=never)
if has_step losses; then
  echo "== tiny-llama, first 5 losses, CPU vs GPU (fp32)"
  trainer train configs/tiny-llama.yaml "${common[@]}" --set train.steps=5 --set train.run_dir=runs/t5-cpu \
    > "$out/t5-cpu.log" 2>&1
  trainer train configs/tiny-llama.yaml "${common[@]}" --set train.steps=5 --set train.run_dir=runs/t5-gpu \
    --set train.device=cuda > "$out/t5-gpu.log" 2>&1
  tail -2 "$out/t5-gpu.log"
  paste <(losses runs/t5-cpu/metrics.jsonl) <(losses runs/t5-gpu/metrics.jsonl) |
    awk '{r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > m) m = r; printf "step %d  cpu %.7f  gpu %.7f  rel %.2e\n", NR, $1, $2, r}
         END {printf "max relative difference %.2e (%s 1e-4)\n", m, m <= 1e-4 ? "within" : "ABOVE"}' |
    tee "$out/t5-compare.txt"
fi
if has_step curve; then
  echo "== tiny-llama, 200 steps, CPU vs GPU (fp32)"
  trainer train configs/tiny-llama.yaml "${common[@]}" --set train.run_dir=runs/t200-cpu > "$out/t200-cpu.log" 2>&1
  trainer train configs/tiny-llama.yaml "${common[@]}" --set train.run_dir=runs/t200-gpu --set train.device=cuda \
    > "$out/t200-gpu.log" 2>&1
  tail -2 "$out/t200-gpu.log"
  paste <(losses runs/t200-cpu/metrics.jsonl) <(losses runs/t200-gpu/metrics.jsonl) |
    awk 'NR % 20 == 0 || NR == 1 {printf "step %3d  cpu %.4f  gpu %.4f\n", NR, $1, $2}' | tee "$out/t200-compare.txt"
  grep -o '"step_ms": *[0-9.]*' runs/t200-gpu/metrics.jsonl | tail -1
fi
# The mean loss of steps 191..200 of two runs, and whether the second is within 2%.
mean_tail_within() {  # FP32_METRICS BF16_METRICS
  paste <(losses "$1" | tail -10) <(losses "$2" | tail -10) |
    awk '{a += $1; b += $2; n++}
         END {r = (b - a) / a; if (r < 0) r = -r;
              printf "mean loss of the last %d steps: fp32 %.4f, bf16 %.4f (%.2f%%, %s 2%%)\n", n, a / n, b / n,
                     100 * r, r <= 0.02 ? "within" : "ABOVE"}'
}
if has_step bf16; then
  echo "== tiny-llama in bf16, first 5 losses, CPU bf16 vs GPU bf16"
  trainer train configs/tiny-llama.yaml "${common[@]}" --set train.steps=5 --set train.precision=bf16 \
    --set train.run_dir=runs/t5-cpu-bf16 > "$out/t5-cpu-bf16.log" 2>&1
  trainer train configs/tiny-llama.yaml "${common[@]}" --set train.steps=5 --set train.precision=bf16 \
    --set train.run_dir=runs/t5-gpu-bf16 --set train.device=cuda > "$out/t5-gpu-bf16.log" 2>&1
  tail -2 "$out/t5-gpu-bf16.log"
  # Both round the same fp32 values to bf16; summation order can move a value across a
  # rounding boundary (a bf16 step, 2^-8), which later steps carry: 1e-3, not fp32's 1e-4.
  paste <(losses runs/t5-cpu-bf16/metrics.jsonl) <(losses runs/t5-gpu-bf16/metrics.jsonl) |
    awk '{r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > m) m = r; printf "step %d  cpu %.7f  gpu %.7f  rel %.2e\n", NR, $1, $2, r}
         END {printf "max relative difference %.2e (%s 1e-3)\n", m, m <= 1e-3 ? "within" : "ABOVE"}' |
    tee "$out/t5-bf16-compare.txt"
  echo "== tiny-llama, 200 steps on the GPU, bf16 vs fp32"
  [ -f runs/t200-gpu/metrics.jsonl ] ||
    trainer train configs/tiny-llama.yaml "${common[@]}" --set train.run_dir=runs/t200-gpu --set train.device=cuda \
      > "$out/t200-gpu.log" 2>&1
  trainer train configs/tiny-llama.yaml "${common[@]}" --set train.run_dir=runs/t200-gpu-bf16 \
    --set train.device=cuda --set train.precision=bf16 > "$out/t200-gpu-bf16.log" 2>&1
  tail -2 "$out/t200-gpu-bf16.log"
  paste <(losses runs/t200-gpu/metrics.jsonl) <(losses runs/t200-gpu-bf16/metrics.jsonl) |
    awk 'NR % 20 == 0 || NR == 1 {printf "step %3d  fp32 %.4f  bf16 %.4f\n", NR, $1, $2}' | tee "$out/t200-bf16-compare.txt"
  mean_tail_within runs/t200-gpu/metrics.jsonl runs/t200-gpu-bf16/metrics.jsonl | tee -a "$out/t200-bf16-compare.txt"
  grep -o '"step_ms": *[0-9.]*' runs/t200-gpu-bf16/metrics.jsonl | tail -1
fi
if has_step bench; then
  # Documents of exactly 4096 tokens (4095 bytes + BOS): every micro-batch is one
  # full causal 4096-token sequence, the work the PyTorch baseline does.
  mkdir -p data-cache
  [ -f data-cache/bench-4096.h5 ] || trainer make-corpus --output data-cache/bench-4096.h5 --documents 400 \
    --min-length 4095 --median-length 4095 --max-length 4095 >/dev/null 2>&1
  # NAME then settings: 10 steps; medians of steps 3..10 (the first two include start-up
  # work) of tokens/s, MFU (the trainer's, against 989 TFLOP/s on an H100), step time,
  # and the device memory of all arenas (peak_mem_bytes).
  bench_run() {
    local name="$1"
    shift
    echo "== bench-llama-1b, $name"
    trainer train configs/bench-llama-1b.yaml --set data.path=data-cache/bench-4096.h5 --set train.steps=10 \
      --set train.run_dir=runs/b1b-$name "$@" > "$out/bench-1b-$name.log" 2>&1
    grep -E 'step +[0-9]+/' "$out/bench-1b-$name.log" | tail -4 | sed 's/.*| loss/loss/'
    grep -E 'peak:|unverified' "$out/bench-1b-$name.log" | head -2
    paste <(grep -o '"tokens_per_s": [0-9.]*' runs/b1b-$name/metrics.jsonl | sed 's/.*: //') \
          <(grep -o '"mfu": [0-9.]*' runs/b1b-$name/metrics.jsonl | sed 's/.*: //') \
          <(grep -o '"step_ms": [0-9.]*' runs/b1b-$name/metrics.jsonl | sed 's/.*: //') \
          <(grep -o '"peak_mem_bytes": [0-9]*' runs/b1b-$name/metrics.jsonl | sed 's/.*: //') | tail -n +3 |
      awk -v name="$name" '{t[NR] = $1; m[NR] = $2; s[NR] = $3; p = $4}
           function med(a, n,   i, j, x) {for (i = 2; i <= n; i++) {x = a[i]; for (j = i - 1; j > 0 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x} return a[int((n + 1) / 2)]}
           END {printf "%s: medians of steps 3..%d: %.0f tokens/s, MFU %.3f, step %.0f ms, peak memory %.1f GB\n",
                       name, NR + 2, med(t, NR), med(m, NR), med(s, NR), p / 1e9}' | tee -a "$out/bench-1b-summary.txt"
  }
  : > "$out/bench-1b-summary.txt"
  bench_run fp32 --set train.tf32=false
  bench_run tf32 --set train.tf32=true
  # bf16 attention (d = 128) runs on the bf16 tensor-core kernels (mma m16n8k16)
  # whatever train.tf32 says; the flag only moves fp32 products to TF32.
  bench_run bf16 --set train.precision=bf16 --set train.tf32=true
  for run in "tf32 --set train.tf32=true" "bf16 --set train.precision=bf16 --set train.tf32=true"; do
    set -- $run
    name="$1"
    shift
    echo "== bench-llama-1b, $name, device time per op (HDP_CUDA_OP_TIMES=1, 4 steps)"
    HDP_CUDA_OP_TIMES=1 trainer train configs/bench-llama-1b.yaml --set data.path=data-cache/bench-4096.h5 \
      --set train.steps=4 --set train.run_dir=runs/b1b-times-$name "$@" > "$out/bench-1b-op-times-$name.log" 2>&1
    sed -n '/device time per op/,/timed total/p' "$out/bench-1b-op-times-$name.log"
  done
fi
if has_step pytorch && python3 -c 'import torch, transformers' 2>/dev/null; then
  echo "== PyTorch + transformers baseline"
  PYTHONUNBUFFERED=1 python3 bench/pytorch_llama_baseline.py --precisions fp32 tf32 bf16 --steps 5 2>&1 |
    grep -v Warning | tee "$out/pytorch.txt"
fi
