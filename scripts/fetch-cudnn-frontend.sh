#!/usr/bin/env bash
# fetch-cudnn-frontend.sh DEST
#
# Puts the headers of NVIDIA's cuDNN frontend (the header-only C++ graph API over
# libcudnn that kernels/cuda/cudnn_attention.cpp is written against) in DEST/include
# and prints DEST/include. They ship in the PyPI wheel nvidia-cudnn-frontend; a wheel
# is a zip, and only its include/ folder is unpacked (the wheel's Python module is
# not used). The version and the wheel's SHA-256 are pinned here; the wheel is kept
# in ${HDP_CACHE_DIR:-~/.cache/hdp-trainer} so several build trees download it once.
# CMake runs this at configure time (the HDP_CUDNN option, CMakeLists.txt). Needs
# curl, unzip and sha256sum (scripts/install-deps.sh installs them).
set -euo pipefail

version=1.32.0
wheel=nvidia_cudnn_frontend-$version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
url=https://files.pythonhosted.org/packages/11/02/660e2dd9f9d9f940e1641443771730612c3aadaafbc5ef7a93cc313d519d/$wheel
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0

[ $# -eq 1 ] || { echo "usage: fetch-cudnn-frontend.sh DEST" >&2; exit 2; }
dest="$1"
stamp="$dest/include/.hdp-cudnn-frontend-$version"
if [ -f "$stamp" ]; then
  echo "$dest/include"
  exit 0
fi
for tool in curl unzip sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch-cudnn-frontend: $tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done

cache="${HDP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hdp-trainer}"
mkdir -p "$cache"
if ! echo "$sha256  $cache/$wheel" | sha256sum --check --status 2>/dev/null; then
  curl -fsSL --retry 3 -o "$cache/$wheel.part" "$url" ||
    { echo "fetch-cudnn-frontend: cannot download $url" >&2; rm -f "$cache/$wheel.part"; exit 1; }
  if ! echo "$sha256  $cache/$wheel.part" | sha256sum --check --status; then
    echo "fetch-cudnn-frontend: $wheel does not have the pinned SHA-256 $sha256" >&2
    rm -f "$cache/$wheel.part"
    exit 1
  fi
  mv "$cache/$wheel.part" "$cache/$wheel"
fi

rm -rf "$dest/include" "$dest/include.part"
mkdir -p "$dest/include.part"
unzip -q "$cache/$wheel" 'include/*' -d "$dest/include.part"
mv "$dest/include.part/include" "$dest/include"
rmdir "$dest/include.part"
[ -f "$dest/include/cudnn_frontend.h" ] || { echo "fetch-cudnn-frontend: $wheel has no include/cudnn_frontend.h" >&2; exit 1; }
touch "$stamp"
echo "$dest/include"
