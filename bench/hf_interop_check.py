# The other half of bench/hf_interop_check.sh: Hugging Face transformers loads a
# model directory written by `trainer export-hf`, continues a prompt greedily, prints
# the new token ids and the mean loss over the prompt and continuation, and writes the
# model back with save_pretrained (safetensors) for `trainer import-hf`. Runs in a
# throwaway virtual environment with torch and transformers; never used by the
# trainer or its tests.
#
#   python3 bench/hf_interop_check.py HF_DIR RESAVED_DIR PROMPT_IDS NEW_TOKENS
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    hf_dir, resaved_dir, prompt_ids, new_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    model.eval()
    ids = torch.tensor([[int(t) for t in prompt_ids.split(",")]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        loss = model(input_ids=out, labels=out).loss.item()
    print(f"class {type(model).__name__}")
    print("new " + ",".join(str(t) for t in out[0, ids.shape[1]:].tolist()))
    print(f"loss {loss:.6f}")
    model.save_pretrained(resaved_dir, safe_serialization=True)


if __name__ == "__main__":
    main()
