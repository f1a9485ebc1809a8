#!/usr/bin/env bash
# Launch test: the trainer binary runs unchanged under Slurm, on a one-node cluster
# on this machine (scripts/slurm/local-cluster.sh).
#
#   bash scripts/slurm/selftest.sh [TRAINER]     # default build/trainer/trainer
#
# 1. sbatch --wait -N1 -n2 scripts/slurm/train.sbatch: mpirun inside the allocation
#    (OpenMPI reads the allocation and starts its daemons with srun), 2 ranks, hdp=2.
# 2. srun -n2 --mpi=pmix trainer train ...: direct launch, Slurm starts the ranks and
#    OpenMPI wires them up through Slurm's PMIx plugin (Debian's OpenMPI 4.1.4 and
#    Slurm 22.05 both use the system PMIx 4.2). --mpi=pmi2 does NOT work with Debian's
#    packages: their OpenMPI is built without --with-pmi (no s1/s2 components, only
#    PMIx), so MPI_Init fails; plain srun (MpiDefault=none) fails the same way.
# 3. srun -n2 --mpi=none trainer train ...: the trainer says, once, to pass --mpi=pmix.
#
# Runs 1 and 2 train tiny-llama for 3 steps on a small corpus; the test checks the exit
# status, 3 lines in metrics.jsonl and "config ... (2 ranks)" in the job's log.
# Exits 0 on success, 77 (ctest: skipped) when Slurm or munge is not installed or,
# not being root, there is no running test cluster to use; anything else is a failure.
# If it started the cluster it stops it at the end; a cluster that was already up is
# left running. Runs of this test on one machine take turns (a lock file).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
trainer="$(realpath "${1:-${TRAINER:-$root/build/trainer/trainer}}")"
cluster="$here/local-cluster.sh"
export PATH="$PATH:/usr/sbin"

skip() { echo "slurm selftest: SKIPPED: $*"; exit 77; }
fail() { echo "slurm selftest: FAILED: $*" >&2; exit 1; }

for cmd in sbatch srun sinfo slurmctld slurmd munged; do
  command -v "$cmd" >/dev/null 2>&1 ||
    skip "$cmd not found; install the Debian packages slurm-wlm and munge (scripts/install-deps.sh)"
done
[ -x "$trainer" ] || fail "no trainer binary at $trainer (build first: scripts/build.sh)"

eval "$(bash "$cluster" env)"        # SLURM_CONF of the test cluster
slurm_dir="$(dirname "$SLURM_CONF")"
if [ "$(id -u)" -ne 0 ] && ! bash "$cluster" status; then
  skip "not root and no test cluster running (start it as root: bash $cluster)"
fi

lock="$slurm_dir/selftest.lock"
if [ "$(id -u)" -eq 0 ]; then mkdir -p "$slurm_dir"; touch "$lock"; fi
if [ -w "$lock" ]; then
  exec 9>>"$lock"
  flock -w 300 9 || fail "another selftest holds $lock for over 300 s"
fi

started=0
work="$(mktemp -d "${TMPDIR:-/tmp}/hdp-slurm-selftest.XXXXXX")"
ok=0
launcher=""    # the running sbatch --wait or srun
cleanup() {
  if [ -n "$launcher" ]; then kill "$launcher" 2>/dev/null || true; wait "$launcher" 2>/dev/null || true; fi
  # A job left behind by a failure (or an interrupted sbatch --wait) is cancelled.
  if [ "$ok" -eq 0 ] && [ -s "$work/sbatch.id" ]; then scancel "$(cat "$work/sbatch.id")" 2>/dev/null || true; fi
  if [ "$started" -eq 1 ]; then bash "$cluster" stop >/dev/null || true; fi
  if [ "$ok" -eq 1 ]; then rm -rf "$work"; else echo "slurm selftest: files kept in $work" >&2; fi
}
trap cleanup EXIT

if ! bash "$cluster" status; then
  started=1      # set first: a half-started cluster is stopped too
  bash "$cluster" start || fail "could not start the local Slurm cluster"
fi

# The job inherits this environment (sbatch and srun export it by default).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_mpi_yield_when_idle=1
export TRAINER="$trainer" HDP_TRAINER_ROOT="$root"

"$trainer" make-corpus --output "$work/corpus.h5" --documents 64 --max-length 2048 \
  > "$work/make-corpus.out" 2>&1 || { cat "$work/make-corpus.out" >&2; fail "make-corpus failed"; }

train_args() {   # the run directory; sets the array args
  args=(--set data.path="$work/corpus.h5" --set parallel.hdp=2 --set train.steps=3 \
    --set train.run_dir="$1" --set train.checkpoint_dir="$1/checkpoints" --set train.resume=never \
    --set train.checkpoint_every=0 --set train.peak_flops=1e11 \
    --set train.log_every=1)
}

# Checks one run: its exit status, its metrics and its log.
check_run() {   # name, status, run directory, log file
  local name="$1" status="$2" run="$3" log="$4" lines
  if [ "$status" -ne 0 ]; then
    tail -n 30 "$log" >&2 || true
    fail "$name: exit status $status (log: $log)"
  fi
  lines="$(wc -l < "$run/metrics.jsonl" 2>/dev/null || echo 0)"
  [ "$lines" -eq 3 ] || { tail -n 30 "$log" >&2; fail "$name: $run/metrics.jsonl has $lines lines, want 3"; }
  grep -q 'config .* (2 ranks)' "$log" ||
    { tail -n 30 "$log" >&2; fail "$name: the log does not show 2 ranks (log: $log)"; }
  echo "slurm selftest: $name: ok (2 ranks, 3 steps, $((SECONDS - t0)) s)"
}

# 1. sbatch + mpirun (scripts/slurm/train.sbatch). --time bounds a hung job.
train_args "$work/run-sbatch"
t0=$SECONDS
status=0
# In the background so that a signal to this script reaches cleanup at once.
sbatch --wait --parsable -N1 -n2 --time=3 --output="$work/sbatch-%j.out" \
  "$root/scripts/slurm/train.sbatch" "$root/configs/tiny-llama.yaml" "${args[@]}" \
  > "$work/sbatch.id" &
launcher=$!
wait "$launcher" || status=$?
launcher=""
log="$work/sbatch-$(cat "$work/sbatch.id").out"
[ -s "$work/sbatch.id" ] && [ -f "$log" ] || fail "sbatch: no job log in $work (sbatch exit status $status)"
check_run "sbatch -N1 -n2 train.sbatch (mpirun)" "$status" "$work/run-sbatch" "$log"

# 2. srun direct launch through PMIx.
train_args "$work/run-srun"
t0=$SECONDS
status=0
srun -N1 -n2 --mpi=pmix --time=3 "$trainer" train "$root/configs/tiny-llama.yaml" \
  "${args[@]}" --set train.threads=1 > "$work/srun.out" 2>&1 &
launcher=$!
wait "$launcher" || status=$?
launcher=""
check_run "srun -n2 --mpi=pmix (direct)" "$status" "$work/run-srun" "$work/srun.out"

# 3. plain srun (no PMI): one line saying what to pass, exit status 2, no MPI_Init.
train_args "$work/run-plain"
t0=$SECONDS
status=0
srun -N1 -n2 --mpi=none --time=3 "$trainer" train "$root/configs/tiny-llama.yaml" \
  "${args[@]}" > "$work/plain.out" 2>&1 &
launcher=$!
wait "$launcher" || status=$?
launcher=""
[ "$status" -ne 0 ] || fail "plain srun: exit status 0, want a refusal (log: $work/plain.out)"
[ "$(grep -c -- 'pass one: srun --mpi=pmix' "$work/plain.out")" -eq 1 ] ||
  { cat "$work/plain.out" >&2; fail "plain srun: want one line naming --mpi=pmix (log: $work/plain.out)"; }
echo "slurm selftest: srun -n2 without PMI: refused once, naming --mpi=pmix ($((SECONDS - t0)) s)"

ok=1
