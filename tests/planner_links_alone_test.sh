#!/usr/bin/env bash
# The planners and the what-if analysis build without the kernels and the runtime
# (planning/ and whatif/ come before kernels/ in the layer order,
# tests/layering_test.sh): reads CMake's generated link command of programs that
# link only those layers and fails, naming the program and the library, if one
# names the kernels' or the runtime's libraries or a GPU or BLAS library.
#   tests/planner_links_alone_test.sh LINK_TXT...
# LINK_TXT: build/<dir>/CMakeFiles/<target>.dir/link.txt (Makefile generators).
set -euo pipefail
[ "$#" -ge 1 ] || { echo "usage: $0 LINK_TXT..." >&2; exit 2; }
forbidden='(lib|-l)(hdp_kernels|hdp_parallel|cudart|cublas|dnnl|openblas)'
bad=0
for link in "$@"; do
  target="$(basename "$(dirname "$link")" .dir)"
  if [ ! -f "$link" ]; then
    echo "planner_links_alone: $link is missing (configure with a Makefile generator)"
    bad=1
    continue
  fi
  found="$(grep -oE "[^ ]*${forbidden}[^ ]*" "$link" | sort -u || true)"
  if [ -n "$found" ]; then
    echo "planner_links_alone: $target links what the planner must not:"
    echo "$found" | sed 's/^/  /'
    bad=1
  else
    echo "planner_links_alone: $target links no kernels, runtime, CUDA, oneDNN or OpenBLAS"
  fi
done
exit "$bad"
