#!/usr/bin/env bash
# The kill -9 soak: a 2-rank tiny-llama run (hdp 2, 1024-token batches) with a
# checkpoint after every step runs under `trainer supervise` while this script
# kills one of its ranks with SIGKILL at a random moment, KILLS times (a random rank after a random
# delay, the next kill once the supervisor has restarted the job). Then it lets
# the run finish and checks against an uninterrupted run of the same config:
#   - every restart resumed from a complete checkpoint and none failed to load one
#     (a corrupt or half-written checkpoint taken for complete would fail its
#     checksums or its manifest and end that restart with an error);
#   - the loss and gradient-norm sequence (metrics.jsonl, every step once) and the
#     final weights (fp32 safetensors from export-hf, byte for byte) are identical.
# Prints the figures (kills, restarts, resumes, steps rerun, ETTR) and exits 1 if a
# check fails.
#
#   bench/kill_soak.sh [--trainer PATH] [--kills N] [--steps N] [--max-delay-s S]
#                      [--seed N] [--work DIR]
# Defaults: 20 kills, 40 steps, delays uniform in [0.2, 4] s, seed 1, a
# temporary work directory (kept with --work).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="$root/build/trainer/trainer"
kills=20
steps=40
max_delay_s=4
seed=1
work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --trainer) trainer="$2"; shift 2 ;;
    --kills) kills="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --max-delay-s) max_delay_s="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kill_soak.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$trainer" ] || { echo "kill_soak.sh: no trainer binary at $trainer (pass --trainer)" >&2; exit 2; }
temporary=0
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  temporary=1
fi
supervisor=""
# On any exit (fail included): stop the supervised job first (its ranks would go on
# writing into the work directory), then delete the directory if it is ours.
cleanup() {
  if [ -n "$supervisor" ] && kill -0 "$supervisor" 2> /dev/null; then
    kill -TERM "$supervisor" 2> /dev/null || true
    wait "$supervisor" 2> /dev/null || true
  fi
  if [ "$temporary" = 1 ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
mkdir -p "$work"
work="$(cd "$work" && pwd)"
cd "$work"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
RANDOM="$seed"
fail() { echo "kill_soak: FAILED: $*"; exit 1; }

[ -e corpus.h5 ] || "$trainer" make-corpus --output corpus.h5 --documents 400 > corpus.log 2>&1 || { cat corpus.log; exit 1; }
train=(mpirun --oversubscribe -np 2 "$trainer" train "$root/configs/tiny-llama.yaml" --set data.path=corpus.h5
       --set parallel.hdp=2 --set train.steps="$steps" --set train.log_every=1 --set train.checkpoint_every=1
       --set train.keep_checkpoints=2 --set train.threads=1 --set train.peak_flops=1e12
       --set data.global_batch_tokens=1024 --set data.micro_batch_tokens=512)

rm -rf ref soak
start=$(date +%s.%N)
"${train[@]}" --set train.run_dir=ref --set train.checkpoint_dir=ref/checkpoints --set train.resume=never > ref.log 2>&1 ||
  { tail -20 ref.log; fail "the uninterrupted run failed"; }
ref_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "kill_soak: uninterrupted run: $steps steps in $ref_s s"

start=$(date +%s.%N)
"$trainer" supervise --max-restarts $((kills + 5)) --backoff-s 0.5 --max-backoff-s 0.5 --run-dir soak \
  --checkpoint-dir soak/checkpoints --stop-signal USR1 -- \
  "${train[@]}" --set train.run_dir=soak --set train.checkpoint_dir=soak/checkpoints --set train.resume=never \
  > soak.log 2>&1 &
supervisor=$!

# grep -c prints 0 itself (and fails) when nothing matches.
restarts_logged() { if [ -e soak/ettr.jsonl ]; then grep -c '"event":"restart"' soak/ettr.jsonl || true; else echo 0; fi; }
# The ranks of the running job: the children of the supervisor's child (mpirun).
ranks_now() {
  local launcher
  launcher="$(pgrep -P "$supervisor" | head -1 || true)"
  [ -n "$launcher" ] && pgrep -P "$launcher" || true
}

done_kills=0
missed=0
half_written=0
while [ "$done_kills" -lt "$kills" ] && kill -0 "$supervisor" 2> /dev/null; do
  # A random delay in [0.2, max_delay_s] s after the job (re)started.
  delay=$(awk -v r="$RANDOM" -v m="$max_delay_s" 'BEGIN { printf "%.2f", 0.2 + (m - 0.2) * r / 32767 }')
  sleep "$delay"
  mapfile -t pids < <(ranks_now)
  if [ "${#pids[@]}" -lt 2 ]; then missed=$((missed + 1)); [ "$missed" -lt 200 ] || fail "no ranks to kill"; sleep 0.2; continue; fi
  victim="${pids[$((RANDOM % ${#pids[@]}))]}"
  before="$(restarts_logged)"
  kill -KILL "$victim" 2> /dev/null || continue
  done_kills=$((done_kills + 1))
  step=0
  if [ -e soak/metrics.jsonl ]; then step="$(grep -c . soak/metrics.jsonl || true)"; fi
  echo "kill_soak: kill $done_kills/$kills: SIGKILL to rank pid $victim after ${delay} s (metrics at step $step)"
  # Wait for the supervisor to notice and restart (or to end, if the run had finished).
  while [ "$(restarts_logged)" = "$before" ] && kill -0 "$supervisor" 2> /dev/null; do sleep 0.1; done
  # Checkpoints the kill cut short: left as step-N.tmp, which resume must skip.
  half_written=$((half_written + $(find soak/checkpoints -maxdepth 1 -name 'step-*.tmp' 2> /dev/null | wc -l)))
done
status=0
wait "$supervisor" || status=$?
supervisor=""  # ended: nothing for cleanup to stop (its pid may be reused)
soak_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
[ "$status" = 0 ] || { tail -30 soak.log; fail "the supervised run ended with $status"; }

# Figures.
restarts=$(grep -c '"event":"restart"' soak/ettr.jsonl || true)
# Rank 0's lines (the other ranks' carry "[rank N]").
resumes=$(grep -v '\[rank ' soak.log | grep -c "resumed from soak/checkpoints/step-" || true)
steps_run=$(grep -v '\[rank ' soak.log | grep -cE "info step +[0-9]+/$steps " || true)
load_errors=$(grep -Eci "checkpoint.*(checksum|corrupt|cannot read|missing|error)|CheckpointError" soak.log || true)
rerun=$(grep -v '\[rank ' soak.log | grep -o "resumed from soak/checkpoints/step-[0-9]* at step [0-9]*" | awk '{print $NF}' | tr '\n' ' ')
ettr=$(tail -1 soak/ettr.jsonl | grep -o '"ettr":[0-9.e+-]*' | cut -d: -f2)
echo "kill_soak: $done_kills kills, $restarts restarts, $resumes resumed from a checkpoint (steps: $rerun)"
echo "kill_soak: $steps_run steps trained for $steps kept ($((steps_run - steps)) rerun after kills)"
echo "kill_soak: $half_written half-written checkpoints (step-N.tmp) found after kills, $load_errors checkpoint load errors"
echo "kill_soak: supervised run $soak_s s against $ref_s s uninterrupted; ETTR $ettr (ettr.jsonl end line)"

column() { grep -o "\"$2\": *[^,]*" "$1" | sed 's/.*: *//'; }
# The last kill may land as the job ends on its own: no restart follows it.
[ "$restarts" -ge $((done_kills - 1)) ] || fail "$done_kills kills but only $restarts restarts"
[ "$load_errors" = 0 ] || { grep -Ei "checkpoint.*(checksum|corrupt|cannot read|missing|error)|CheckpointError" soak.log | head; fail "checkpoint load errors"; }
for key in step loss grad_norm; do
  diff <(column ref/metrics.jsonl "$key") <(column soak/metrics.jsonl "$key") > /dev/null ||
    fail "the $key sequence differs from the uninterrupted run"
done
for run in ref soak; do
  "$trainer" export-hf "$run/checkpoints" --output "$run-hf" --dtype fp32 > "$run-export.log" 2>&1 ||
    { cat "$run-export.log"; fail "export-hf $run"; }
done
cmp -s ref-hf/model.safetensors soak-hf/model.safetensors || fail "final weights differ"
echo "kill_soak: PASS: loss and grad-norm sequences ($steps steps) and final weights bit-identical to the uninterrupted run"
