#!/usr/bin/env bash
# Builds everything and runs the whole test suite with ctest, then every fuzz
# target for FUZZ_SECONDS (default 5) each (scripts/fuzz.sh, a Clang build of its own).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

# Everything, CUDA included where nvcc is (CI compiles it), whatever a demo build
# left in the cache.
bash "$root/scripts/build.sh" -DHDP_CUDA=ON -DHDP_BUILD_TESTS=ON -DHDP_BUILD_BENCH=ON
# mpirun as root (CI containers) and more ranks than cores (2-core machines).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
bash "$root/scripts/fuzz.sh" "${FUZZ_SECONDS:-5}"
