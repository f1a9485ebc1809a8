#!/usr/bin/env bash
# Prepares, on the development machine, what a lent GPU machine runs: a portable
# CUDA build (HDP_NATIVE=OFF: AVX2 code for any x86-64 host; sm_90 for Hopper) of
# the trainer and the communicator conformance test in build-gpu/, bundled with its
# libraries and OpenMPI's plugins (scripts/bundle.sh) and packed into
# gpu-carry/bundle.tar.zst, which must stay under the device's 64 MiB (the bundle
# script checks it). Then, on the device: carry gpu-carry and run
# `bash bench/gpu_check.sh` (docs/performance.md has the numbers of the last sitting).
#   bench/gpu_prepare.sh [ARCHITECTURES]      (default 90; "80;90" for A100s too)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
arch="${1:-90}"
build="$root/build-gpu"
bash "$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHDP_NATIVE=OFF -DHDP_CUDA_ARCHITECTURES="$arch" \
  -DHDP_BUILD_BENCH=OFF >/dev/null
grep -q '^CMAKE_CUDA_COMPILER:FILEPATH=/' "$build/CMakeCache.txt" ||
  { echo "gpu_prepare: no CUDA compiler found; the bundle would have no GPU backend" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target trainer mpi_communicator_conformance_test
mkdir -p "$root/gpu-carry"
bash "$root/scripts/bundle.sh" --archive "$root/gpu-carry/bundle.tar.zst" "$root/gpu-carry/bundle" \
  "$build/trainer/trainer" "$build/tests/mpi_communicator_conformance_test"
rm -rf "$root/gpu-carry/bundle"
echo "gpu_prepare: carry gpu-carry and run: bash bench/gpu_check.sh"
