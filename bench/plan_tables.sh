#!/usr/bin/env bash
# The simulated plan tables of docs/performance.md as markdown rows: for each model,
# data set and context one `trainer plan` run at 1,024 GPUs, tp 8, seed 1, 32M tokens,
# and one row: with MODEL:auto (`--pp auto`) the pipeline degree chosen, the step's
# lower bound, then per policy its step, its multiple of the
# bound, tokens/s in millions, its speed-up over static (not in static's own cell
# unless --setup) and with --setup the setup that won (the recompute column); a
# run where no policy places the batch gives "does not fit" throughout.
#   bench/plan_tables.sh [--trainer PATH] [--setup] MODEL:PP[,MODEL:PP...] [trainer plan options]
# Environment: CLUSTER (default configs/cluster/h100.yaml), DATA (default "byted
# github"), CONTEXTS (default "256K 512K 1M 2M"),
# POLICIES (default static,naive,balance,naive-no-offload).
# Example (the main table): bench/plan_tables.sh llama-7b:1,llama-70b:4 --recompute none
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="$root/build/trainer/trainer"
setup=0
while [ $# -gt 0 ]; do
  case "$1" in
    --trainer) trainer="$2"; shift 2 ;;
    --setup) setup=1; shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "usage: $0 [--trainer PATH] [--setup] MODEL:PP[,MODEL:PP...] [trainer plan options]" >&2; exit 2; }
layouts="$1"; shift
policies="${POLICIES:-static,naive,balance,naive-no-offload}"
cd "$root"
for layout in ${layouts//,/ }; do
  model="${layout%%:*}" pp="${layout##*:}"
  label="${model#llama-}"; label="${label^^}"
  for data in ${DATA:-byted github}; do
    for context in ${CONTEXTS:-256K 512K 1M 2M}; do
      failed=0
      out="$("$trainer" plan --cluster "${CLUSTER:-configs/cluster/h100.yaml}" --model "configs/models/$model.yaml" \
        --gpus 1024 --tp 8 --pp "$pp" --context "$context" --global-batch-tokens 32M --lengths "$data" --seed 1 \
        --policies "$policies" "$@" 2>/dev/null)" || failed=1
      awk -v policies="$policies" -v setup="$setup" -v failed="$failed" -v row="| $label | $data | $context |" '
        $1 == "pp" && $3 == "chosen" { row = row " pp " $2 " |" }
        $1 == "bound" { row = row " " $2 " s |" }
        # A policy summary line: the first line naming it (its detail lines follow later).
        !($1 in seen) && index("," policies ",", "," $1 ",") {
          seen[$1] = 1
          if ($2 == "does") { cell[$1] = "does not fit"; next }
          speedup = $7
          tokens = $6; gsub(",", "", tokens)
          c = sprintf("%s s (%s), %.2f M/s", $4, $5, tokens / 1e6)
          if ($1 != "static" || setup) c = c ", " speedup
          if (setup) c = c ", " $2
          cell[$1] = c
        }
        END {
          n = split(policies, p, ",")
          for (i = 1; i <= n; ++i) row = row " " (p[i] in cell ? cell[p[i]] : failed ? "does not fit" : "-") " |"
          print row
        }' <<< "$out"
    done
  done
done
