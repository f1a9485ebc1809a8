#!/usr/bin/env bash
# README.md's `trainer plan` examples run as README writes them (the shipped
# configs, from the repository root), each under a generous time limit: an example
# that hangs, fails or prints no plan fails this test. A smoke run, not a timing (the
# examples take about a second; the limit only catches a planner gone quadratic).
# An example is a line starting `trainer plan` and the lines its trailing
# backslashes continue it onto, up to a `#` comment.
#   tests/readme_plan_examples_test.sh TRAINER [REPO_ROOT] [SECONDS]
set -uo pipefail
trainer="$1"
root="${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
limit="${3:-300}"
cd "$root"
mapfile -t examples < <(awk '
  !open && /^[[:space:]]*trainer plan / { open = 1; example = "" }
  open {
    line = $0
    sub(/#.*/, "", line)
    continued = line ~ /\\[[:space:]]*$/
    sub(/\\[[:space:]]*$/, "", line)
    example = example " " line
    if (!continued) { print example; open = 0 }
  }' README.md)
if [ "${#examples[@]}" -eq 0 ]; then
  echo "readme_plan_examples: README.md shows no trainer plan example"
  exit 1
fi
bad=0
for example in "${examples[@]}"; do
  read -ra words <<< "$example"
  start=$(date +%s%N)
  output="$(timeout "$limit" "$trainer" "${words[@]:1}" 2>&1)"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if [ "$rc" -eq 124 ]; then
    echo "readme_plan_examples: did not finish in $limit s: ${words[*]}"
    bad=1
  elif [ "$rc" -ne 0 ] || ! grep -q "of bound" <<< "$output"; then
    echo "readme_plan_examples: exit code $rc, no plan table: ${words[*]}"
    echo "$output" | tail -20
    bad=1
  else
    echo "readme_plan_examples: ${ms} ms: ${words[*]}"
  fi
done
exit "$bad"
