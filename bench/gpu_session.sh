#!/usr/bin/env bash
# One sitting on a GPU machine, run from the repository root: proves the CUDA
# backend and measures it, writing every log under OUTDIR.
#   1. trainer selftest (every op and five training steps against the CPU backend)
#   2. tiny-llama: the first 5 losses on the GPU (fp32) against the CPU
#   3. tiny-llama: 200 steps in fp32 on the GPU, the loss curve beside the CPU's
#   4. bench-llama-1b: step time, tokens/s, MFU, peak memory (fp32, then TF32)
#   5. the same shape in Hugging Face LlamaForCausalLM on PyTorch (when importable)
#
#   bench/gpu_session.sh BUNDLE OUTDIR [steps...]
# BUNDLE is a directory made by scripts/bundle.sh from a CUDA build. CUDA's own
# libraries are taken from the system or, failing that, from a PyTorch
# installation's nvidia-* wheels.
set -uo pipefail
bundle="$(cd "$1" && pwd)"
out="$2"
shift 2
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(selftest losses curve bench pytorch)
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

if has_step losses || has_step curve; then
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
if has_step bench; then
  # Documents of exactly 4096 tokens (4095 bytes + BOS): every micro-batch is one
  # full causal 4096-token sequence, the work the PyTorch baseline does.
  mkdir -p data-cache
  [ -f data-cache/bench-4096.h5 ] || trainer make-corpus --output data-cache/bench-4096.h5 --documents 400 \
    --min-length 4095 --median-length 4095 --max-length 4095 >/dev/null 2>&1
  for tf32 in false true; do
    echo "== bench-llama-1b, tf32=$tf32"
    trainer train configs/bench-llama-1b.yaml --set data.path=data-cache/bench-4096.h5 --set train.steps=10 \
      --set train.tf32=$tf32 --set train.run_dir=runs/b1b-$tf32 > "$out/bench-1b-tf32-$tf32.log" 2>&1
    grep -E 'step +[0-9]+/' "$out/bench-1b-tf32-$tf32.log" | tail -4 | sed 's/.*| loss/loss/'
    # Medians of steps 3..10 (the first two include start-up work): tokens/s, MFU, step time.
    paste <(grep -o '"tokens_per_s": [0-9.]*' runs/b1b-$tf32/metrics.jsonl | sed 's/.*: //') \
          <(grep -o '"mfu": [0-9.]*' runs/b1b-$tf32/metrics.jsonl | sed 's/.*: //') \
          <(grep -o '"step_ms": [0-9.]*' runs/b1b-$tf32/metrics.jsonl | sed 's/.*: //') | tail -n +3 |
      awk '{t[NR] = $1; m[NR] = $2; s[NR] = $3}
           function med(a, n,   i, j, x) {for (i = 2; i <= n; i++) {x = a[i]; for (j = i - 1; j > 0 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x} return a[int((n + 1) / 2)]}
           END {printf "medians of steps 3..%d: %.0f tokens/s, MFU %.3f, step %.0f ms\n", NR + 2, med(t, NR), med(m, NR), med(s, NR)}'
  done
  echo "== bench-llama-1b, tf32, device time per op (HDP_CUDA_OP_TIMES=1, 4 steps)"
  HDP_CUDA_OP_TIMES=1 trainer train configs/bench-llama-1b.yaml --set data.path=data-cache/bench-4096.h5 \
    --set train.steps=4 --set train.tf32=true --set train.run_dir=runs/b1b-times > "$out/bench-1b-op-times.log" 2>&1
  sed -n '/device time per op/,/timed total/p' "$out/bench-1b-op-times.log"
fi
if has_step pytorch && python3 -c 'import torch, transformers' 2>/dev/null; then
  echo "== PyTorch + transformers baseline"
  PYTHONUNBUFFERED=1 python3 bench/pytorch_llama_baseline.py --precisions fp32 tf32 bf16 --steps 5 2>&1 |
    grep -v Warning | tee "$out/pytorch.txt"
fi
