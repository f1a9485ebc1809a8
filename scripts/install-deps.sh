#!/usr/bin/env bash
# Installs the Debian 12 packages hdp-trainer builds against, only those missing.
# As root it runs apt-get; otherwise it prints the exact command to run.
#
#   scripts/install-deps.sh [all|demo]
# all (the default, scripts/test.sh): everything the build, the test suite, the fuzzing,
# the benchmarks, the Slurm launch test and the GPU bundle use. demo (scripts/demo.sh):
# only what building and running the trainer needs, plus cuDNN's fetch tools when
# HDP_CUDA=ON (a CUDA build).
set -euo pipefail
profile="${1:-all}"

packages=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libyaml-cpp-dev
  libhdf5-dev
  libspdlog-dev
  libopenblas-dev
  libdnnl-dev       # oneDNN: the CPU GEMM (kernels/cpu/gemm.h)
  nlohmann-json3-dev   # JSON: safetensors headers, config.json, tokenizer.json, op traces
  libsentencepiece-dev # SentencePiece tokenizer.model files (data/)
  libpcre2-dev         # the byte-level BPE pre-tokenizer regex (data/)
)
cudnn_fetch=(curl unzip ca-certificates)  # cuDNN's frontend headers at configure time (scripts/fetch-cudnn-frontend.sh)
case "$profile" in
  all)
    packages+=(
      sentencepiece        # spm_train / spm_encode: the tokenizer tests compare against them
      libgtest-dev
      libbenchmark-dev
      slurm-wlm munge   # launch tests (scripts/slurm/selftest.sh)
      # scripts/fuzz.sh: Clang (14 on Debian 12) with libFuzzer and the sanitizer
      # runtimes, Clang's OpenMP, and llvm-symbolizer for readable reports
      clang libclang-rt-dev libomp-dev llvm
      "${cudnn_fetch[@]}"
    ) ;;
  demo)
    if [ "${HDP_CUDA:-OFF}" = ON ]; then packages+=("${cudnn_fetch[@]}"); fi ;;
  *) echo "install-deps: unknown profile '$profile' (all or demo)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: missing: ${missing[*]}"
# apt-get and dpkg print a few lines per package (hundreds with dependencies): they go
# to a log, shown only when the install fails.
install_missing() {  # [sudo]
  local started=$SECONDS apt_log
  apt_log="$(mktemp -t hdp-install-deps.XXXXXX.log)"
  echo "install-deps: apt-get install (log: $apt_log) ..."
  if ! { "$@" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
         "$@" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    echo "install-deps: apt-get failed (above; log: $apt_log)" >&2
    exit 1
  fi
  echo "install-deps: installed ${#missing[@]} packages ($(grep -c "^Setting up" "$apt_log") with their dependencies) in $((SECONDS - started)) s"
  rm -f "$apt_log"
}
if [ "$(id -u)" -eq 0 ]; then
  install_missing
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  install_missing sudo
else
  echo "install-deps: not root; run:"
  echo "  sudo apt-get install -y ${missing[*]}"
  exit 1
fi
