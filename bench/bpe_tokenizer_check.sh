#!/usr/bin/env bash
# The tokenizer.json encoder (data/bpe_tokenizer.cpp) against Hugging Face's tokenizers
# library, in time and ids: a byte-level BPE (LLaMA-3's regex, 8000 tokens) trained by the
# library on docs/*.md and README.md, then one long plain document (that text 8 times,
# 3.3 MB) and the same text as JSON Lines (one document per paragraph, 8 times), each
# through `trainer prepare-data` and the library's encode_batch.
#
#   bench/bpe_tokenizer_check.sh PYTHON [OUT_DIR]
# PYTHON: a python3 of a throwaway virtual environment with tokenizers, h5py and numpy.
set -euo pipefail
python="$1"
out="${2:-runs/bpe-tokenizer-check}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${TRAINER:-$root/build/trainer/trainer}"
cd "$root"
rm -rf "$out" && mkdir -p "$out"
cat docs/*.md README.md > "$out/text.txt"
"$python" bench/bpe_tokenizer_check.py prepare "$out" "$out/text.txt"
status=0
for input in long.txt docs.jsonl; do
  start=$(date +%s.%N)
  "$trainer" prepare-data --input "$out/$input" --output "$out/$input.h5" --tokenizer "$out/tokenizer.json" >/dev/null 2>&1
  seconds=$(echo "$(date +%s.%N) - $start" | bc)
  echo "$input ($(stat -c %s "$out/$input") bytes): trainer prepare-data $(printf '%.2f' "$seconds") s; " \
       "$("$python" bench/bpe_tokenizer_check.py compare "$out" "$out/$input" "$out/$input.h5")" || status=1
done
exit $status
