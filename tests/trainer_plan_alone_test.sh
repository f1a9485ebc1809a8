#!/usr/bin/env bash
# `trainer plan` and trainer_plan_alone (the same command linked from its own
# library, without the runtime or the kernels) print the same plans: one dense and
# one Mixtral example, and a bad input, which both refuse with exit 2. Wall-clock
# figures (the planners' and simulator's own timings, log time stamps) are masked
# before comparing.
#   tests/trainer_plan_alone_test.sh TRAINER TRAINER_PLAN_ALONE REPO_ROOT
set -euo pipefail
[ "$#" -eq 3 ] || { echo "usage: $0 TRAINER TRAINER_PLAN_ALONE REPO_ROOT" >&2; exit 2; }
trainer="$1" alone="$2" root="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The policy table's "plan s" column (wall-clock planning time) is blanked by its
# position under the header, up to the blank line that ends the table.
mask_timings() {
  grep -v -e 'timing:' -e 'drawn in' | sed -E 's/^\[[0-9:.]+\] //' |
    awk '!at && index($0, "plan s") { at = index($0, "plan s") - 4 }
         at && $0 == "" { at = 0 }
         at { $0 = substr($0, 1, at - 1) "     -    " substr($0, at + 10) }
         { print }'
}

compare() {  # compare NAME EXPECTED_EXIT ARGS...
  local name="$1" expected="$2"
  shift 2
  local rc_trainer=0 rc_alone=0
  "$trainer" plan "$@" >"$work/$name.trainer" 2>&1 || rc_trainer=$?
  "$alone" "$@" >"$work/$name.alone" 2>&1 || rc_alone=$?
  if [ "$rc_trainer" -ne "$expected" ] || [ "$rc_alone" -ne "$expected" ]; then
    echo "trainer_plan_alone: $name: exit codes $rc_trainer (trainer plan) and $rc_alone (alone), expected $expected"
    cat "$work/$name.alone"
    exit 1
  fi
  if ! diff <(mask_timings <"$work/$name.trainer") <(mask_timings <"$work/$name.alone"); then
    echo "trainer_plan_alone: $name: the outputs differ (above: < trainer plan, > alone)"
    exit 1
  fi
  echo "trainer_plan_alone: $name: same output, exit $expected ($(wc -l <"$work/$name.alone") lines)"
}

cd "$root"
compare llama-7b 0 --cluster configs/cluster/h100.yaml --model configs/models/llama-7b.yaml \
  --gpus 64 --context 256K --global-batch-tokens 4M --lengths byted
compare mixtral 0 --cluster configs/cluster/h100.yaml --model configs/models/mistral-8x7b.yaml \
  --gpus 64 --tp 2 --context 64K --global-batch-tokens 2M --lengths github
compare bad-layout 2 --cluster configs/cluster/h100.yaml --model configs/models/llama-7b.yaml \
  --gpus 63 --tp 2 --context 64K --global-batch-tokens 2M --lengths byted
