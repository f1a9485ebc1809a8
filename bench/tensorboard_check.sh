#!/usr/bin/env bash
# The trainer's TensorBoard event files (metrics.tensorboard: true) read by
# TensorBoard's own reader: a 2-rank tiny-llama run of 12 steps with a checkpoint at
# step 6, whose checkpoint of step 12 is then removed and the run resumed (steps 7-12
# run twice, in two event files), is read with
# tensorboard.backend.event_processing.event_accumulator from a throwaway virtual
# environment (pip install tensorboard). Checks: every step 1-12 once per tag, every
# key of metrics.jsonl a tag (the per-rank busy_ms/rank_R included), and loss, lr,
# grad_norm and tokens_per_s equal to metrics.jsonl's values at float precision.
# Prints what the reader saw; exits 1 if a check fails. Not part of the test suite
# (which has no Python); tests/base_tfevents_test.cpp checks the bytes.
#
#   bench/tensorboard_check.sh [--trainer PATH] [--work DIR] [--venv DIR]
# Defaults: build/trainer/trainer, a temporary work directory (kept with --work),
# /tmp/tbvenv (created when it lacks tensorboard).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="$root/build/trainer/trainer"
work=""
venv=/tmp/tbvenv
while [ $# -gt 0 ]; do
  case "$1" in
    --trainer) trainer="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tensorboard_check.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$trainer" ] || { echo "tensorboard_check.sh: no trainer binary at $trainer (pass --trainer)" >&2; exit 2; }
if [ -z "$work" ]; then
  work="$(mktemp -d "${TMPDIR:-/tmp}/hdp-tensorboard.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

if ! "$venv/bin/python" -c 'import tensorboard' 2> /dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet tensorboard
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
"$trainer" make-corpus --output "$work/corpus.h5" --documents 200 --max-length 2000 > "$work/make-corpus.log" 2>&1
run="$work/run"
train() {
  mpirun --oversubscribe -np 2 "$trainer" train "$root/configs/tiny-llama.yaml" --set data.path="$work/corpus.h5" \
    --set train.steps=12 --set train.run_dir="$run" --set train.checkpoint_every=6 --set train.resume=auto \
    --set train.peak_flops=1e11 --set train.threads=1 --set metrics.tensorboard=true >> "$work/train.log" 2>&1 ||
    { tail -n 20 "$work/train.log" >&2; echo "tensorboard_check.sh: training failed" >&2; exit 1; }
}
train
rm -rf "$run/checkpoints/step-00000012"
train   # resumes from step 6: steps 7-12 again, in a second event file
echo "event files: $(ls "$run/tensorboard" | tr '\n' ' ')"

"$venv/bin/python" -c '
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
run = sys.argv[1]
acc = ea.EventAccumulator(run + "/tensorboard", size_guidance={ea.SCALARS: 0})
acc.Reload()
tags = sorted(acc.Tags()["scalars"])
print("tensorboard", __import__("tensorboard").__version__, "read", len(tags), "scalar tags:", " ".join(tags))
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
bad = []
for key, value in lines[0].items():
    if key in ("step", "time"): continue
    want = key + "/rank_0" if isinstance(value, list) else key
    if want not in tags: bad.append("no tag " + want)
for tag in tags:
    steps = [e.step for e in acc.Scalars(tag)]
    if steps != list(range(1, 13)): bad.append(tag + ": steps " + str(steps))
for tag in ("loss", "lr", "grad_norm", "tokens_per_s", "busy_ms/rank_1"):
    got = [e.value for e in acc.Scalars(tag)]
    key, _, rank = tag.partition("/rank_")
    want = [l[key][int(rank)] if rank else l[key] for l in lines]
    print("%-15s" % tag, " ".join("%.6g" % v for v in got))
    for step, (g, w) in enumerate(zip(got, want), 1):
        if abs(g - w) > 1e-6 * abs(w): bad.append("%s step %d: %r != %r" % (tag, step, g, w))
print("FAILED: " + "; ".join(bad) if bad else "ok: every tag has steps 1-12 once and the values of metrics.jsonl")
sys.exit(1 if bad else 0)
' "$run"
