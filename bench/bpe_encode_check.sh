#!/usr/bin/env bash
# The tokenizer.json encoder (data/bpe_tokenizer.cpp) against Hugging Face's
# `tokenizers` library on the same files: ids equal, and the time of each. A
# byte-level BPE with LLaMA-3's pre-tokenizer and 256 added tokens is trained by the
# library on this machine's own text (Python's standard library sources and the
# license texts under /usr/share/common-licenses: code and English prose); both then
# encode (a) every file as one document of a JSON Lines corpus and (b) all of it as a
# single document (time linear in a document's length). The library encodes with
# encode_batch over every core; the trainer runs `prepare-data --threads` every core.
# Not part of the test suite (which has no Python): tests/data_bpe_tokenizer_test.cpp
# checks the encoder's ids on a fixture.
#
#   bench/bpe_encode_check.sh [--trainer PATH] [--work DIR] [--venv DIR] [--vocab N] [--megabytes M]
# Defaults: build/trainer/trainer, /tmp/hdp-bpe-check, /tmp/tokvenv (created when it
# lacks tokenizers and h5py), a 32,000-token vocabulary, about 20 MB of text.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="$root/build/trainer/trainer"
work=/tmp/hdp-bpe-check
venv=/tmp/tokvenv
vocab=32000
megabytes=20
while [ $# -gt 0 ]; do
  case "$1" in
    --trainer) trainer="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --megabytes) megabytes="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bpe_encode_check.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$trainer" ] || { echo "bpe_encode_check.sh: no trainer binary at $trainer (pass --trainer)" >&2; exit 2; }
mkdir -p "$work/tokenizer"
if ! "$venv/bin/python" -c 'import tokenizers, h5py, numpy' 2> /dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet tokenizers h5py numpy
fi
py=("$venv/bin/python" "$root/bench/bpe_encode_check.py")

# The corpus: one document per file, up to the size asked for; and all of it as one.
"$venv/bin/python" - "$work" "$megabytes" <<'PY'
import glob, json, sys, sysconfig
work, limit = sys.argv[1], int(sys.argv[2]) << 20
files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/**/*.py", recursive=True))
files += sorted(glob.glob("/usr/share/common-licenses/*"))
docs, size = [], 0
for path in files:
    try:
        text = open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, IsADirectoryError):
        continue
    if not text:
        continue  # prepare-data skips empty documents; the library would encode BOS and EOS
    docs.append(text)
    size += len(text.encode())
    if size >= limit:
        break
with open(f"{work}/docs.jsonl", "w") as f:
    for t in docs:
        f.write(json.dumps({"text": t}) + "\n")
with open(f"{work}/one.jsonl", "w") as f:
    f.write(json.dumps({"text": "".join(docs)}) + "\n")
print(f"corpus: {len(docs)} documents, {size / 1e6:.1f} MB")
PY
[ -f "$work/tokenizer/tokenizer.json" ] || "${py[@]}" train "$work/docs.jsonl" "$work/tokenizer" "$vocab"
threads=$(nproc)
status=0
for corpus in docs one; do
  theirs=$("${py[@]}" encode "$work/tokenizer" "$work/$corpus.jsonl" "$work/$corpus-theirs.npy")
  start=$(date +%s.%N)
  "$trainer" prepare-data --input "$work/$corpus.jsonl" --output "$work/$corpus.h5" --overwrite \
    --tokenizer "$work/tokenizer/tokenizer.json" --threads "$threads" > "$work/$corpus.log" 2>&1
  ours=$(echo "$(date +%s.%N) - $start" | bc)
  same=$("${py[@]}" compare "$work/$corpus.h5" "$work/$corpus-theirs.npy") || status=1
  printf '%-5s tokenizers %7.2f s   trainer prepare-data %7.2f s (%.2fx)   %s\n' \
    "$corpus" "$theirs" "$ours" "$(echo "$ours / $theirs" | bc -l)" "$same"
done
echo "threads $threads; load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
