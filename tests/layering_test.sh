#!/usr/bin/env bash
# The include direction of the source folders: a folder may include its own
# headers and those of the folders before it in this order, never those after it:
#   kernels  <  parallel  <  data  <  trainer
# (kernels know nothing of communicators, the model or files; the model and the
# training program sit on top). Prints every offending include with its file and
# line and exits 1 if there is one.
#   tests/layering_test.sh [REPO_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
layers=(kernels parallel data trainer)

bad=0
for ((i = 0; i < ${#layers[@]}; ++i)); do
  folder="${layers[$i]}"
  for ((j = i + 1; j < ${#layers[@]}; ++j)); do
    higher="${layers[$j]}"
    while IFS= read -r hit; do
      echo "layering: $hit: $folder/ includes $higher/, a higher layer"
      bad=1
    done < <(cd "$root" && grep -rnE "#include \"$higher/" "$folder" --include='*.h' --include='*.cpp' \
               --include='*.cu' --include='*.cuh' || true)
  done
done
if [ "$bad" -ne 0 ]; then exit 1; fi
echo "layering: ${layers[*]}: every include points down or sideways"
