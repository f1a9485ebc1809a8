#!/usr/bin/env bash
# Interchange with Hugging Face transformers, checked with transformers itself (which
# the tests may not use): for tiny-llama, tiny-mistral (a window of 16 tokens,
# shorter than the text generated), tiny-mixtral (4 experts, top 2) and tiny-llama
# with LLaMA 3's RoPE scaling (theta 500000, factor 8, original context 64 and
# high_freq_factor 8, so that every band of the 16 frequencies is present: kept,
# blended and divided), train a few steps, `trainer export-hf` (fp32), load the
# directory with transformers' from_pretrained, and compare its greedy continuation
# of a prompt with `trainer generate`'s and its loss over prompt + continuation with
# `trainer eval`'s (for Mixtral with the load-balancing term, which ours includes);
# then let transformers save the model again (save_pretrained), `trainer import-hf`
# that directory, export it once more and compare the two exports' tensors bit for bit.
#
#   bench/hf_interop_check.sh PYTHON [OUT_DIR]
# PYTHON: a python3 of a throwaway virtual environment with torch and transformers.
set -euo pipefail
python="$1"
out="${2:-runs/hf-interop}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="${TRAINER:-$root/build/trainer/trainer}"
cd "$root"
[[ -f data-cache/demo-corpus.h5 ]] || "$trainer" make-corpus --output data-cache/demo-corpus.h5
rm -rf "$out" && mkdir -p "$out"
prompt="Where does Clara live?"
new_tokens=40
# The byte-level vocabulary: BOS 256, then the prompt's bytes.
prompt_ids="256$(printf '%s' "$prompt" | od -An -tu1 -v | tr -s ' \n' ',' | sed 's/,$//')"
status=0
for model in tiny-llama tiny-mistral tiny-mixtral tiny-llama-rope-llama3; do
  run="$out/$model"
  # tiny-mistral with a window of 16, well inside the 63 positions of prompt and continuation.
  # (${settings[@]+...}: an empty array under set -u fails on bash < 4.4.)
  config="configs/$model.yaml"
  settings=()
  [[ $model == tiny-mistral ]] && settings=(--set model.sliding_window=16)
  if [[ $model == tiny-llama-rope-llama3 ]]; then
    config=configs/tiny-llama.yaml
    settings=(--set model.rope_theta=500000 --set model.rope_scaling=llama3 --set model.rope_scaling_factor=8
              --set model.rope_low_freq_factor=1 --set model.rope_high_freq_factor=8
              --set model.rope_original_max_positions=64)
  fi
  "$trainer" train "$config" ${settings[@]+"${settings[@]}"} --set train.steps=60 --set train.run_dir="$run" \
    --set train.checkpoint_dir="$run/checkpoints" --set train.checkpoint_every=60 >"$run.train.log" 2>&1
  # The converters' log lines go to the run's log (set -e stops at a failure; the log says why).
  "$trainer" export-hf "$run/checkpoints" --output "$run/hf" --dtype fp32 >/dev/null 2>>"$run.train.log"
  ours=$("$trainer" generate "$run/checkpoints" --prompt "$prompt" --max-new-tokens $new_tokens --threads 1 2>/dev/null)
  ours="${ours#"$prompt"}"  # generate prints the prompt, then its continuation
  # Both losses over prompt + our continuation + EOS, one document (byte-level: no BOS).
  printf '%s' "$prompt$ours" >"$run/scored.txt"
  "$trainer" prepare-data --input "$run/scored.txt" --output "$run/scored.h5" >/dev/null 2>>"$run.train.log"
  our_loss=$("$trainer" eval "$run/checkpoints" --data "$run/scored.h5" --threads 1 2>/dev/null |
             sed -n 's/.*: loss \([0-9.]*\).*/\1/p')
  eval_ids="$(printf '%s' "$prompt$ours" | od -An -tu1 -v | tr -s ' \n' ',' | sed 's/^,//; s/,$//'),257"
  theirs=$("$python" bench/hf_interop_check.py "$run/hf" "$run/hf-resaved" "$prompt_ids" $new_tokens "$eval_ids" \
           2>>"$run.train.log")
  # Their new ids as text (bytes; ids >= 256 are BOS/EOS and end the text as ours does).
  # LC_ALL=C: under a UTF-8 locale gawk's %c prints 128..255 as two bytes.
  their_text=$(sed -n 's/^new //p' <<<"$theirs" | tr ',' '\n' | LC_ALL=C awk '$1 < 256 { printf "%c", $1 } $1 >= 256 { exit }')
  their_loss=$(sed -n 's/^loss_with_aux //p' <<<"$theirs")
  echo "$model: transformers loaded it as $(sed -n 's/^class //p' <<<"$theirs")"
  echo "  loss over prompt + continuation: ours $our_loss, transformers $their_loss (cross-entropy alone" \
       "$(sed -n 's/^loss //p' <<<"$theirs")), difference $(awk -v a="$our_loss" -v b="$their_loss" 'BEGIN { d = a - b; printf "%.2e", d < 0 ? -d : d }')"
  echo "  ours:         $(printf '%q' "$ours")"
  echo "  transformers: $(printf '%q' "$their_text")"
  if [[ "$ours" == "$their_text" ]]; then echo "  greedy continuations: identical"; else echo "  greedy continuations: DIFFER"; status=1; fi
  "$trainer" import-hf "$run/hf-resaved" --output "$run/reimported" >/dev/null 2>>"$run.train.log"
  "$trainer" export-hf "$run/reimported" --output "$run/hf-again" --dtype fp32 >/dev/null 2>>"$run.train.log"
  if cmp -s "$run/hf/model.safetensors" "$run/hf-again/model.safetensors"; then
    echo "  export -> transformers save_pretrained -> import-hf -> export: model.safetensors byte-identical"
  else
    "$python" - "$run/hf/model.safetensors" "$run/hf-again/model.safetensors" <<'PY' || status=1
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), f"tensor names differ: {sorted(set(a) ^ set(b))}"
bad = [k for k in a if not (a[k] == b[k]).all()]
print("  export -> transformers save_pretrained -> import-hf -> export: " +
      ("every tensor bit-identical (files differ in layout only)" if not bad else f"tensors differ: {bad}"))
sys.exit(1 if bad else 0)
PY
  fi
done
exit $status
