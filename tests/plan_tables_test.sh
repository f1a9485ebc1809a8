#!/usr/bin/env bash
# bench/plan_tables.sh, which makes the rows of docs/performance.md's plan tables, on
# one small cell: a fixed layout and one with --pp auto and --setup, each a row of the
# header's width (4 + policies columns, one more for the chosen pp) with a step in
# every policy's cell, so the script cannot rot unseen.
#   tests/plan_tables_test.sh TRAINER REPO_ROOT
set -euo pipefail
trainer="$1" root="$2"
fail() { echo "plan_tables: $*"; exit 1; }
export DATA=byted CONTEXTS=256K POLICIES=static,balance
fixed="$(bash "$root/bench/plan_tables.sh" --trainer "$trainer" llama-7b:1 --recompute none)"
auto="$(bash "$root/bench/plan_tables.sh" --trainer "$trainer" --setup llama-7b:auto --recompute none)"
echo "$fixed"
echo "$auto"
cells() { awk -F'|' '{ print NF - 2 }' <<< "$1"; }
[ "$(wc -l <<< "$fixed")" -eq 1 ] || fail "one row expected, got: $fixed"
[ "$(cells "$fixed")" -eq 6 ] || fail "6 cells expected (model, data, context, bound, 2 policies): $fixed"
[ "$(cells "$auto")" -eq 7 ] || fail "7 cells expected (the chosen pp too): $auto"
grep -Eq '^\| 7B \| byted \| 256K \| [0-9.]+ s \| [0-9.]+ s \([0-9.]+\), [0-9.]+ M/s \| [0-9.]+ s \([0-9.]+\), [0-9.]+ M/s, [0-9.]+x \|$' <<< "$fixed" ||
  fail "the fixed row is not as the tables write it: $fixed"
grep -Eq '^\| 7B \| byted \| 256K \| pp [0-9]+ \| [0-9.]+ s \| .*, 1.00x, none \| .*x, none \|$' <<< "$auto" ||
  fail "the auto row lacks the chosen pp or the setups: $auto"
echo "plan_tables: ok"
