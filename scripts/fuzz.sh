#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ (docs/fuzzing.md) with Clang, libFuzzer and the
# address and undefined-behaviour sanitizers in build-fuzz/, then runs each for
# SECONDS (default 10) over a scratch copy of its corpus fuzz/corpus/NAME (the
# checked-in corpus is never written). Prints one line per target: executions,
# executions per second, inputs that reached new code, the coverage reached, and
# the outcome; a crash, sanitizer report, leak, hang or over-limit allocation names
# its reproducer, and the script exits 1.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (targets: every fuzz/*_fuzz.cpp)
#
# FUZZ_BUILD_DIR (default build-fuzz) and FUZZ_JOBS (default: every core) set the
# build; each target's corpus, log and reproducers land in FUZZ_BUILD_DIR/runs/NAME.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-10}"
[ $# -gt 0 ] && shift
case "$seconds" in '' | *[!0-9]*) echo "fuzz: SECONDS_PER_TARGET must be a whole number, got '$seconds'" >&2; exit 2 ;; esac
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for source in "$root"/fuzz/*_fuzz.cpp; do
    name="$(basename "$source" _fuzz.cpp)"
    targets+=("$name")
  done
fi
for name in "${targets[@]}"; do
  [ -f "$root/fuzz/${name}_fuzz.cpp" ] || { echo "fuzz: no target '$name' (fuzz/${name}_fuzz.cpp)" >&2; exit 2; }
done
build_dir="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found; scripts/install-deps.sh installs it" >&2; exit 2; }

mkdir -p "$build_dir"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
CC=clang CXX=clang++ cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHDP_FUZZ=ON \
  -DHDP_BUILD_TESTS=OFF -DHDP_BUILD_BENCH=OFF -DHDP_CUDA=OFF "${launcher[@]}" >"$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log" >&2; exit 1; }
cmake --build "$build_dir" -j "${FUZZ_JOBS:-$(nproc)}" --target "${targets[@]/%/_fuzz}"

# Leaks count; a failed UB check is a crash, with its stack.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
final_stat() { sed -n "s/^stat::$2: *//p" "$1" | tail -1; }  # final_stat LOG NAME: libFuzzer's -print_final_stats
printf '%-16s %12s %10s %10s %8s  %s\n' target executions exec/s new-inputs cov outcome
for name in "${targets[@]}"; do
  run="$build_dir/runs/$name"
  rm -rf "$run/corpus" "$run/tmp"
  mkdir -p "$run/corpus" "$run/tmp"
  cp -r "$root/fuzz/corpus/$name/." "$run/corpus/"
  # -timeout: one input running 10 s is a hang; -malloc_limit_mb: no input of a few
  # KB may ask for 1 GB at once (every size a file declares is checked first).
  status=0
  TMPDIR="$run/tmp" "$build_dir/fuzz/${name}_fuzz" "$run/corpus" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$run/" \
    >"$run/log" 2>&1 || status=$?
  cov="$(grep -oE 'cov: [0-9]+' "$run/log" | tail -1 | cut -d' ' -f2)"
  if [ "$status" -eq 0 ]; then
    outcome=ok
  else
    failed=1
    reproducer="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$run/log" | tail -1)"
    outcome="FAILED (exit $status): $(grep -m1 -E '^==[0-9]+==ERROR|runtime error|ERROR: libFuzzer|out-of-memory|deadly signal|Timeout' "$run/log" || true); reproducer ${reproducer:-none}; log $run/log"
  fi
  printf '%-16s %12s %10s %10s %8s  %s\n' "$name" "$(final_stat "$run/log" number_of_executed_units)" "$(final_stat "$run/log" average_exec_per_sec)" \
    "$(final_stat "$run/log" new_units_added)" "${cov:-?}" "$outcome"
done
exit "$failed"
