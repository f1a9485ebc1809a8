#!/usr/bin/env bash
# The include direction of the source folders: a folder may include its own
# headers and those of the folders before it in this order, never those after it:
#   base < spec < planning < whatif < kernels < parallel < model < data < config
#        < checkpoint < run < trainer
# (docs/architecture.md says why). The planners and the what-if analysis come
# before the kernels, so they build and link without them. Rules on top of the
# order: data/ reads step plans (planning/plan.h) but never includes a planner or
# the what-if analysis, and kernels/cpu and kernels/cuda never include each other.
# A folder's CMakeLists.txt may link only the libraries of the folders before it,
# so the link order is the include order. Prints every offence with its file and
# line and exits 1 if there is one.
#   tests/layering_test.sh [REPO_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
layers=(base spec planning whatif kernels parallel model data config checkpoint run trainer)
sources=(--include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh')

bad=0
report() {  # report RULE < grep hits
  while IFS= read -r hit; do
    echo "layering: $hit: $1"
    bad=1
  done
}
# The libraries each folder's CMakeLists.txt defines (config/ has two, trainer/ three).
declare -A libraries
for folder in "${layers[@]}"; do
  libraries[$folder]="$(cd "$root" && grep -ohE 'add_library\(hdp_[a-z_]+' "$folder/CMakeLists.txt" 2>/dev/null |
    sed 's/add_library(//' | tr '\n' ' ' || true)"
done
for ((i = 0; i < ${#layers[@]}; ++i)); do
  folder="${layers[$i]}"
  [ -d "$root/$folder" ] || { echo "layering: $folder/ is missing"; bad=1; continue; }
  for ((j = i + 1; j < ${#layers[@]}; ++j)); do
    higher="${layers[$j]}"
    report "$folder/ includes $higher/, a higher layer" < <(cd "$root" &&
      grep -rnE "#include \"$higher/" "$folder" "${sources[@]}" || true)
    for library in ${libraries[$higher]}; do
      report "$folder/ links $library, a library of $higher/, a higher layer" < <(cd "$root" &&
        grep -nE "\b$library\b" "$folder/CMakeLists.txt" | grep -vE "add_library\($library\b" |
        sed "s#^#$folder/CMakeLists.txt:#" || true)
    done
  done
done
report "data/ includes a planner or the what-if analysis; it may only read plans (planning/plan.h, planning/cost_model.h, planning/ring_layout.h)" < <(cd "$root" &&
  grep -rnE '#include "(planning/(hdp_planner|stage_split|pipeline_schedule)\.h|whatif/)' data "${sources[@]}" || true)
report "a CPU kernel includes the CUDA backend" < <(cd "$root" &&
  grep -rnE '#include "kernels/cuda/' kernels/cpu "${sources[@]}" || true)
report "a CUDA kernel includes the CPU backend" < <(cd "$root" &&
  grep -rnE '#include "kernels/cpu/' kernels/cuda "${sources[@]}" || true)
# Every source folder at the top is a layer (a new one must be placed in the order),
# but for the programs over all of them: tests/, bench/ and the fuzz targets (fuzz/).
for dir in "$root"/*/; do
  name="$(basename "$dir")"
  case " ${layers[*]} tests bench fuzz scripts docs configs build " in *" $name "*) continue ;; esac
  if compgen -G "$dir*.cpp" >/dev/null || compgen -G "$dir*.h" >/dev/null; then
    echo "layering: $name/ holds sources but is not in the layer order of tests/layering_test.sh"
    bad=1
  fi
done
if [ "$bad" -ne 0 ]; then exit 1; fi
echo "layering: ${layers[*]}: every include and link points down or sideways"
