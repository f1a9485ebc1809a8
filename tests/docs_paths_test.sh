#!/usr/bin/env bash
# The docs name files that exist: every path of a source folder (base/ ... trainer/,
# tests/, bench/, scripts/, configs/, docs/) that README.md or docs/*.md mentions,
# e.g. `run/engine.h` or kernels/cuda/attention.cu, must be a file or folder of the
# tree (or, for a program, bench/x standing for bench/x.cpp); and the map in
# docs/architecture.md must draw every layer of tests/layering_test.sh. So the docs
# cannot drift from the code. Prints each dangling mention as FILE:LINE: PATH and
# exits 1 if there is one.
#   tests/docs_paths_test.sh [REPO_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root"
folders='base|spec|planning|whatif|kernels|parallel|model|data|config|checkpoint|run|trainer|fuzz|tests|bench|scripts|configs|docs'
bad=0
checked=0
while IFS=: read -r file line path; do
  path="${path%.}"          # a sentence's full stop
  path="${path%,}"
  path="${path%:}"
  checked=$((checked + 1))
  case "$path" in *'*'*|*'NAME'*|*'<'*) continue ;; esac   # patterns and placeholders
  # A program is named by its source (bench/ring_exchange_bench: bench/ring_exchange_bench.cpp).
  if [ ! -e "$path" ] && [ ! -e "$path.cpp" ]; then
    echo "docs_paths: $file:$line: $path does not exist"
    bad=1
  fi
done < <(grep -noE "(^|[^A-Za-z0-9_./-])($folders)/[A-Za-z0-9_./-]*[A-Za-z0-9_]" README.md docs/*.md |
  sed -E "s#^([^:]+):([0-9]+):[^A-Za-z0-9_]?#\1:\2:#" | grep -vE ':(configs|data-cache|runs|checkpoints)/[^:]*\.(h5|jsonl|bin|idx)$')
# The map names every layer of the include order (tests/layering_test.sh).
layers="$(sed -n 's/^layers=(\(.*\))$/\1/p' tests/layering_test.sh)"
[ -n "$layers" ] || { echo "docs_paths: no layers=(...) line in tests/layering_test.sh"; exit 1; }
for layer in $layers; do
  grep -qE "^ *$layer/ " docs/architecture.md || { echo "docs_paths: docs/architecture.md's map lacks $layer/"; bad=1; }
done
if [ "$bad" -ne 0 ]; then exit 1; fi
echo "docs_paths: $checked paths named in README.md and docs/*.md all exist"
