#!/usr/bin/env bash
# `trainer supervise` restarts a real training run: a 2-rank tiny-llama (hdp 2,
# a checkpoint every 2 steps, each waited for: deferred ones may all still be in
# flight at the fault under load) whose rank 1 dies at step 5 on the first run
# (HDP_FAULT_INJECT, base/fault_injection.h; set only while HDP_SUPERVISE_RESTART
# is 0, so the restart runs clean). The supervisor must restart it once, the
# restart must resume from a checkpoint, and the run must end with the loss and
# gradient-norm sequence and the final weights bit-identical to an uninterrupted
# run. ettr.jsonl must hold one restart line naming the failure and an end line.
#   tests/supervise_train_test.sh TRAINER_BINARY
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "supervise_train_test: $*"; exit 1; }

"$trainer" make-corpus --output corpus.h5 --documents 300 > corpus.log 2>&1 || { cat corpus.log; exit 1; }
train=(mpirun --oversubscribe -np 2 "$trainer" train "$root/configs/tiny-llama.yaml" --set data.path=corpus.h5
       --set parallel.hdp=2 --set train.steps=8 --set train.log_every=1 --set train.checkpoint_every=2
       --set train.threads=1 --set data.global_batch_tokens=2048 --set data.micro_batch_tokens=1024
       --set train.checkpoint_budget=0)

"${train[@]}" --set train.run_dir=ref --set train.checkpoint_dir=ref/checkpoints > ref.log 2>&1 ||
  { tail -20 ref.log; fail "the uninterrupted run failed"; }

# The command as one string for sh -c: the fault only on the first run.
command="$(printf '%q ' "${train[@]}") --set train.run_dir=sup --set train.checkpoint_dir=sup/checkpoints"
status=0
"$trainer" supervise --max-restarts 2 --backoff-s 0 --run-dir sup -- \
  sh -c "if [ \"\$HDP_SUPERVISE_RESTART\" = 0 ]; then export HDP_FAULT_INJECT=1:5; fi; exec $command" \
  > sup.log 2>&1 || status=$?
[ "$status" = 0 ] || { tail -30 sup.log; fail "supervise exited $status"; }
grep -q "fault injection" sup.log || { tail -30 sup.log; fail "the fault was not injected"; }
grep -q "restart 1 under trainer supervise: train.resume=auto" sup.log || fail "the restart did not force resume"
grep -Eq "resumed from sup/checkpoints/step-0000000[24] at step [24]" sup.log ||
  { grep -n "resumed\|restart" sup.log; fail "the restart did not resume from step 2 or 4"; }

# Losses and gradient norms, step by step, as written (%.9g): identical text.
column() { grep -o "\"$2\": *[^,]*" "$1" | sed 's/.*: *//'; }
for key in step loss grad_norm; do
  diff <(column ref/metrics.jsonl "$key") <(column sup/metrics.jsonl "$key") > /dev/null ||
    { paste <(column ref/metrics.jsonl "$key") <(column sup/metrics.jsonl "$key"); fail "$key differs"; }
done
[ "$(column sup/metrics.jsonl step | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 " ] || fail "steps in sup/metrics.jsonl are not 1..8 once each"

# Final weights: both as fp32 safetensors (no timestamps in the file), byte for byte.
for run in ref sup; do
  "$trainer" export-hf "$run/checkpoints" --output "$run-hf" --dtype fp32 > "$run-export.log" 2>&1 ||
    { cat "$run-export.log"; fail "export-hf $run failed"; }
done
cmp ref-hf/model.safetensors sup-hf/model.safetensors || fail "final weights differ"

lines="$(wc -l < sup/ettr.jsonl)"
[ "$lines" = 2 ] || { cat sup/ettr.jsonl; fail "ettr.jsonl has $lines lines, expected 2"; }
head -1 sup/ettr.jsonl | grep -q '"event":"restart"' || fail "first ettr line is not the restart"
head -1 sup/ettr.jsonl | grep -Eq '"cause":"(exit code [0-9]+|killed by signal [0-9]+[^"]*)"' || fail "no cause in the restart line"
tail -1 sup/ettr.jsonl | grep -q '"outcome":"success"' || fail "last ettr line is not a success"
tail -1 sup/ettr.jsonl | grep -q '"restarts":1' || fail "last ettr line does not count 1 restart"
tail -1 sup/ettr.jsonl | grep -q '"last_kept_step":8' || fail "last ettr line does not keep steps up to 8"
ratio="$(tail -1 sup/ettr.jsonl | grep -o '"ettr":[0-9.e+-]*' | cut -d: -f2)"
awk -v r="$ratio" 'BEGIN { exit !(r > 0 && r < 1) }' || fail "ETTR $ratio is not in (0, 1)"
echo "supervise_train_test: restarted once, bit-identical to the uninterrupted run; ETTR $ratio"
