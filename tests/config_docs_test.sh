#!/usr/bin/env bash
# docs/configuration.md's key tables are the config schema's (config/schema.cpp):
# each block between "<!-- BEGIN keys SECTION" and "<!-- END keys SECTION -->" must
# be what `trainer config --keys-markdown` prints for that section, and every
# section must have its block. Fails with the diff and the command that
# regenerates the blocks (--update rewrites them in place; the prose around them
# is left as it is).
#   bash tests/config_docs_test.sh TRAINER [--update]
set -euo pipefail
trainer=$1
mode=${2:-check}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
doc=$root/docs/configuration.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$trainer" config --keys-markdown > "$work/generated"

if [ "$mode" = --update ]; then
  # Each block of the doc replaced by the generated block of its section.
  awk -v generated="$work/generated" '
    BEGIN {
      while ((getline line < generated) > 0) {
        if (line ~ /^<!-- BEGIN keys /) { split(line, w, " "); section = w[4] }
        block[section] = block[section] line "\n"
      }
    }
    /^<!-- BEGIN keys / {
      split($0, w, " ")
      if (!(w[4] in block)) { print "no section " w[4] " in the schema" > "/dev/stderr"; exit 1 }
      printf "%s", block[w[4]]; skipping = 1; next
    }
    skipping && /^<!-- END keys / { skipping = 0; next }
    !skipping { print }
  ' "$doc" > "$work/doc"
  cp "$work/doc" "$doc"
fi

awk '/^<!-- BEGIN keys /{inside=1} inside{print} /^<!-- END keys /{inside=0}' "$doc" > "$work/documented"
if ! diff -u "$work/documented" "$work/generated"; then
  echo
  echo "docs/configuration.md's key tables (-) differ from the schema (+), config/schema.cpp."
  echo "Regenerate them with: bash tests/config_docs_test.sh build/trainer/trainer --update"
  echo "(a section whose block is missing needs its two marker lines first)"
  exit 1
fi
echo "docs/configuration.md's key tables match the schema ($(grep -c '^<!-- BEGIN keys ' "$work/generated") sections)"
