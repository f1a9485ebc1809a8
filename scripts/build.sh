#!/usr/bin/env bash
# Installs missing dependencies, configures and builds into build/ (or $BUILD_DIR).
#
#   scripts/build.sh [-DOPTION=VALUE ...] [TARGET ...]
# -D options go to cmake's configure step; targets (default: all) to the build.
# HDP_DEPS picks scripts/install-deps.sh's profile (default all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
options=()
targets=()
for arg in "$@"; do
  case "$arg" in
    -D*) options+=("$arg") ;;
    *) targets+=(--target "$arg") ;;
  esac
done

bash "$root/scripts/install-deps.sh" "${HDP_DEPS:-all}"
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${options[@]+"${options[@]}"} >/dev/null
cmake --build "$build_dir" -j "$(nproc)" ${targets[@]+"${targets[@]}"}
