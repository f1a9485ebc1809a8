# The other half of bench/hf_interop_check.sh: Hugging Face transformers loads a
# model directory written by `trainer export-hf`, continues a prompt greedily, prints
# the new token ids and its mean loss over a token sequence (the one `trainer eval`
# measured), and writes the model back with save_pretrained (safetensors) for
# `trainer import-hf`. For Mixtral also the loss with the load-balancing term
# (output_router_logits), which our loss includes. Runs in a throwaway virtual
# environment with torch and transformers; never used by the trainer or its tests.
#
#   python3 bench/hf_interop_check.py HF_DIR RESAVED_DIR PROMPT_IDS NEW_TOKENS EVAL_IDS
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    hf_dir, resaved_dir, prompt_ids, new_tokens, eval_ids = sys.argv[1:6]
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    ids = torch.tensor([[int(t) for t in prompt_ids.split(",")]])
    scored = torch.tensor([[int(t) for t in eval_ids.split(",")]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=int(new_tokens), do_sample=False, eos_token_id=None,
                             pad_token_id=0)
        loss = model(input_ids=scored, labels=scored).loss.item()
        moe = getattr(model.config, "num_local_experts", None) is not None
        with_aux = model(input_ids=scored, labels=scored, output_router_logits=True).loss.item() if moe else loss
    print(f"class {type(model).__name__}")
    print("new " + ",".join(str(t) for t in out[0, ids.shape[1]:].tolist()))
    print(f"loss {loss:.9f}")
    print(f"loss_with_aux {with_aux:.9f}")
    model.save_pretrained(resaved_dir, safe_serialization=True)


if __name__ == "__main__":
    main()
