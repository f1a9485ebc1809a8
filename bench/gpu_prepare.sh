#!/usr/bin/env bash
# Prepares, on the development machine, what a lent GPU machine runs: a portable
# CUDA build (HDP_NATIVE=OFF: AVX2 code for any x86-64 host; sm_90 for Hopper) of
# the trainer and the communicator conformance test in build-gpu/, with cuDNN's
# attention, bundled with its libraries and OpenMPI's plugins (scripts/bundle.sh)
# and packed into gpu-carry/bundle.tar.gz, which must stay under the device's
# 64 MiB (the bundle script checks it). Then, on the device: carry gpu-carry and run
# `bash bench/gpu_check.sh` (docs/performance.md has the numbers of the last sitting).
#   bench/gpu_prepare.sh [ARCHITECTURES]      (default 90; "80;90" for A100s too)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
arch="${1:-90}"
build="$root/build-gpu"
bash "$root/scripts/install-deps.sh"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DHDP_NATIVE=OFF -DHDP_CUDA_ARCHITECTURES="$arch" \
  -DHDP_BUILD_BENCH=OFF -DHDP_CUDNN=ON > "$build/configure.log" ||
  { tail -20 "$build/configure.log" >&2; echo "gpu_prepare: configure failed (log: $build/configure.log)" >&2; exit 1; }
cache="$build/CMakeCache.txt"
grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=/' "$cache" ||
  { echo "gpu_prepare: no CUDA compiler found; the bundle would have no GPU backend" >&2; exit 1; }
# Without cuDNN the build quietly falls back to our attention kernels and the
# sitting's cuDNN rows would measure those instead. cuDNN is built only when
# configure found cudnn.h and libcudnn (cached) and fetched the frontend's headers,
# and then configure says so (HDP_HAVE_CUDNN itself is not cached).
if ! grep -q '^CUDNN_INCLUDE_DIR:PATH=/' "$cache" || ! grep -q '^CUDNN_LIBRARY:FILEPATH=/' "$cache" ||
   [ ! -f "$build/_deps/cudnn-frontend/include/cudnn_frontend.h" ] ||
   ! grep -q 'hdp-trainer: cuDNN attention (' "$build/configure.log"; then
  echo "gpu_prepare: the build would have no cuDNN attention (train.attention=cudnn could not run):" >&2
  grep -E 'no cuDNN attention' "$build/configure.log" >&2 || true
  grep -E '^CUDNN_(INCLUDE_DIR|LIBRARY):' "$cache" >&2 || echo "  CUDNN_INCLUDE_DIR / CUDNN_LIBRARY not in $cache" >&2
  echo "  frontend headers: $build/_deps/cudnn-frontend/include/cudnn_frontend.h" \
    "$([ -f "$build/_deps/cudnn-frontend/include/cudnn_frontend.h" ] && echo present || echo missing)" >&2
  exit 1
fi
cmake --build "$build" -j "$(nproc)" --target trainer mpi_communicator_conformance_test
mkdir -p "$root/gpu-carry"
rm -f "$root/gpu-carry/bundle.tar.zst"  # the older format: it would travel too, for nothing
bash "$root/scripts/bundle.sh" --archive "$root/gpu-carry/bundle.tar.gz" "$root/gpu-carry/bundle" \
  "$build/trainer/trainer" "$build/tests/mpi_communicator_conformance_test"
rm -rf "$root/gpu-carry/bundle"
echo "gpu_prepare: carry gpu-carry and run: bash bench/gpu_check.sh"
