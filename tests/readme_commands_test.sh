#!/usr/bin/env bash
# Every command of README.md's ```bash blocks runs, as README writes it, in README's
# order, from a scratch directory that links configs/, docs/, scripts/, bench/ and the built
# trainer as build/trainer/trainer (so the commands' relative paths resolve as from the
# repository root, and what they write stays in the scratch directory).
#
# Conventions (README.md says them too):
# - a command is a line of a ```bash block plus the lines its trailing backslashes
#   continue it onto; blank lines and comment lines are not commands;
# - a command whose line ends in a comment `# not in CI: REASON` is skipped (printed
#   with its reason): it needs a GPU, Slurm, a download or hours;
# - a training command (`trainer train`, also under mpirun or supervise, and
#   scripts/demo.sh) gets $README_CI_TRAIN_ARGS appended (default: 2 steps, a
#   checkpoint at step 2, a fixed peak so the GEMM probe does not run);
# - `trainer plan` commands are left to tests/readme_plan_examples_test.sh.
# A command that exits non-zero or runs past the limit fails the test, which then
# goes on with the next command and exits 1 at the end.
#   tests/readme_commands_test.sh TRAINER [REPO_ROOT] [SECONDS_PER_COMMAND]
set -uo pipefail
trainer="$(readlink -f "$1")"
root="$(cd "${2:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)"
limit="${3:-120}"
train_args="${README_CI_TRAIN_ARGS:---set train.steps=2 --set train.checkpoint_every=2 --set train.peak_flops=1e11}"
[ -x "$trainer" ] || { echo "readme_commands: no trainer at $1"; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
scratch="$(mktemp -d "${TMPDIR:-/tmp}/readme-commands.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
for dir in configs docs scripts bench; do ln -s "$root/$dir" "$scratch/$dir"; done
mkdir -p "$scratch/build/trainer"
ln -s "$trainer" "$scratch/build/trainer/trainer"

# One command per output line: continuations joined, inside ```bash blocks only.
mapfile -t commands < <(awk '
  /^```bash[[:space:]]*$/ { inside = 1; next }
  /^```/ { inside = 0; next }
  !inside { next }
  {
    line = $0
    if (line ~ /\\[[:space:]]*$/) { sub(/\\[[:space:]]*$/, "", line); pending = pending line; next }
    line = pending line; pending = ""
    if (line ~ /^[[:space:]]*(#.*)?$/) next
    print line
  }' "$root/README.md")
if [ "${#commands[@]}" -eq 0 ]; then
  echo "readme_commands: README.md has no command in a bash block"
  exit 1
fi

# The command without its trailing comment: from the first `#` that follows a blank
# outside quotes, as bash reads a comment.
strip_comment() {
  local text="$1" out="" quote="" ch prev=" " i
  for (( i = 0; i < ${#text}; i++ )); do
    ch="${text:i:1}"
    if [ -n "$quote" ]; then
      [ "$ch" = "$quote" ] && quote=""
    elif [ "$ch" = "'" ] || [ "$ch" = '"' ]; then
      quote="$ch"
    elif [ "$ch" = "#" ] && [[ "$prev" =~ [[:space:]] ]]; then
      break
    fi
    out+="$ch"
    prev="$ch"
  done
  sed -E 's/[[:space:]]+$//' <<< "$out"
}

cd "$scratch"
ran=0 skipped=0 bad=0
start_all=$(date +%s)
for command in "${commands[@]}"; do
  if [[ "$command" =~ \#[[:space:]]*not\ in\ CI:[[:space:]]*(.*)$ ]]; then
    echo "readme_commands: skipped (${BASH_REMATCH[1]}): ${command%%#*}"
    skipped=$((skipped + 1))
    continue
  fi
  if [[ "$command" =~ (^|[[:space:]/])trainer[[:space:]]+plan[[:space:]] ]]; then
    echo "readme_commands: left to readme_plan_examples: $command"
    skipped=$((skipped + 1))
    continue
  fi
  run="$(strip_comment "$command")"
  if [[ "$run" =~ (^|[[:space:]/])trainer[[:space:]]+train[[:space:]] || "$run" =~ (^|[[:space:]/])scripts/demo\.sh ]]; then
    run="$run $train_args"
  fi
  ran=$((ran + 1))
  start=$(date +%s%N)
  output="$(timeout -k 10 "$limit" bash -c "$run" 2>&1)"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "readme_commands: FAILED, did not finish in $limit s: $run"
    echo "$output" | tail -20
    bad=1
  elif [ "$rc" -ne 0 ]; then
    echo "readme_commands: FAILED, exit code $rc after $ms ms: $run"
    echo "$output" | tail -20
    bad=1
  else
    echo "readme_commands: ok, $ms ms: $run"
  fi
done
echo "readme_commands: $ran commands run, $skipped skipped, $(( $(date +%s) - start_all )) s in all"
[ "$ran" -gt 0 ] || { echo "readme_commands: no command ran"; exit 1; }
exit "$bad"
