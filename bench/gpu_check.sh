#!/usr/bin/env bash
# The one call to make on a lent GPU machine (the `device` tool runs it from the
# repository root, with gpu-carry/ carried):
#   bash bench/gpu_check.sh [steps...]        (steps: see bench/gpu_session.sh; default all)
# Unpacks gpu-carry/bundle.tar.zst (made on the development machine by
# bench/gpu_prepare.sh) under /tmp, runs bench/gpu_session.sh, and leaves in $OUT
# (./gpu-logs where OUT is unset) summary.txt and logs.tar.gz: the device tool
# brings back at most 8 files, so every log travels in the one archive.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
archive="$root/gpu-carry/bundle.tar.zst"
results="${OUT:-$root/gpu-logs}"
mkdir -p "$results"
[ -f "$archive" ] || { echo "gpu_check: $archive is missing: run bench/gpu_prepare.sh here and carry gpu-carry" >&2; exit 2; }
work=/tmp/hdp-gpu
rm -rf "$work" && mkdir -p "$work"
start=$(date +%s)
if command -v zstd >/dev/null; then zstd -dc "$archive" | tar -C "$work" -x
else tar --zstd -C "$work" -xf "$archive"; fi || { echo "gpu_check: cannot unpack $archive (zstd missing?)" >&2; exit 2; }
echo "gpu_check: unpacked the bundle in $(( $(date +%s) - start )) s"
bash "$root/bench/gpu_session.sh" "$work/bundle" "$work/logs" "$@"
rc=$?
cp "$work/logs/summary.txt" "$results/" 2>/dev/null
tar -C "$work" -czf "$results/logs.tar.gz" logs
echo "gpu_check: $(( $(date +%s) - start )) s in all; summary.txt and logs.tar.gz in $results"
exit $rc
