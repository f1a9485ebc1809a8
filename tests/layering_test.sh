#!/usr/bin/env bash
# The include direction of the source folders: a folder may include its own
# headers and those of the folders before it in this order, never those after it:
#   base < kernels < parallel < model < planning < data < trainer
# (docs/architecture.md says why). Two rules on top of the order: data/ reads
# step plans (planning/plan.h) but never includes a planner, and kernels/cpu and
# kernels/cuda never include each other. Prints every offending include with
# its file and line and exits 1 if there is one.
#   tests/layering_test.sh [REPO_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
layers=(base kernels parallel model planning data trainer)
sources=(--include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh')

bad=0
report() {  # report RULE < grep hits
  while IFS= read -r hit; do
    echo "layering: $hit: $1"
    bad=1
  done
}
for ((i = 0; i < ${#layers[@]}; ++i)); do
  folder="${layers[$i]}"
  for ((j = i + 1; j < ${#layers[@]}; ++j)); do
    higher="${layers[$j]}"
    report "$folder/ includes $higher/, a higher layer" < <(cd "$root" &&
      grep -rnE "#include \"$higher/" "$folder" "${sources[@]}" || true)
  done
done
report "data/ includes a planner; it may only read plans (planning/plan.h)" < <(cd "$root" &&
  grep -rnE '#include "planning/(hdp_planner|simulator|step_simulation)\.h"' data "${sources[@]}" || true)
report "a CPU kernel includes the CUDA backend" < <(cd "$root" &&
  grep -rnE '#include "kernels/cuda/' kernels/cpu "${sources[@]}" || true)
report "a CUDA kernel includes the CPU backend" < <(cd "$root" &&
  grep -rnE '#include "kernels/cpu/' kernels/cuda "${sources[@]}" || true)
if [ "$bad" -ne 0 ]; then exit 1; fi
echo "layering: ${layers[*]}: every include points down or sideways"
