#!/usr/bin/env bash
# The one call to make on a lent GPU machine (the `device` tool runs it from the
# repository root, with gpu-carry/ carried, under its 600 s limit):
#   bash bench/gpu_check.sh [steps...]        (steps: see bench/gpu_session.sh; default all)
# Unpacks gpu-carry/bundle.tar.gz (made on the development machine by
# bench/gpu_prepare.sh) under /tmp, runs bench/gpu_session.sh, and leaves in $OUT
# (./gpu-logs where OUT is unset) summary.txt and logs.tar.gz: the device tool
# brings back at most 8 files, so every log travels in the one archive. The session
# rewrites both after every row of the summary, so a sitting killed at the device's
# limit still brings back what finished.
# HDP_GPU_DEADLINE (seconds since the epoch; default 540 s after the start, which
# leaves a minute of the device's 600 s for packing and the transfer) is when the
# session stops starting steps and cuts each step's time limit to what is left.
# Where the device grants a shorter limit (its reply's limit_s, when little device
# time is left), start it as HDP_GPU_DEADLINE=$(( $(date +%s) + LIMIT - 60 )) bash ...
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2
start=$(date +%s)
export HDP_GPU_DEADLINE="${HDP_GPU_DEADLINE:-$((start + 540))}"
archive="$root/gpu-carry/bundle.tar.gz"
results="${OUT:-$root/gpu-logs}"
mkdir -p "$results" || { echo "gpu_check: cannot create $results" >&2; exit 2; }
[ -f "$archive" ] || { echo "gpu_check: $archive is missing: run bench/gpu_prepare.sh here and carry gpu-carry" >&2; exit 2; }
work=/tmp/hdp-gpu
rm -rf "$work" && mkdir -p "$work" || { echo "gpu_check: cannot make a fresh $work" >&2; exit 2; }
# gzip: every image has it (zstd, which packs smaller, may be missing).
tar -C "$work" -xzf "$archive" || { echo "gpu_check: cannot unpack $archive (tar -xzf failed; truncated in transfer?)" >&2; exit 2; }
[ -x "$work/bundle/run.sh" ] || { echo "gpu_check: $archive holds no bundle/run.sh" >&2; exit 2; }
echo "gpu_check: unpacked the bundle in $(( $(date +%s) - start )) s; deadline in $(( HDP_GPU_DEADLINE - $(date +%s) )) s"
HDP_GPU_RESULTS="$results" bash "$root/bench/gpu_session.sh" "$work/bundle" "$work/logs" "$@"
rc=$?
# Again at the end: the session's last copy may predate its last log lines.
# Written aside and renamed: a kill during the tar keeps the archive already there.
cp "$work/logs/summary.txt" "$results/" 2>/dev/null
tar -C "$work" -czf "$results/logs.tar.gz.part" logs && mv -f "$results/logs.tar.gz.part" "$results/logs.tar.gz"
echo "gpu_check: $(( $(date +%s) - start )) s in all; summary.txt and logs.tar.gz in $results"
exit $rc
