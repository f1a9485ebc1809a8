# The comparison for configs/bench-llama-1b.yaml: Hugging Face LlamaForCausalLM
# (attn_implementation="sdpa") on PyTorch eager, same shape, same tokens per
# step (4 sequences of 4096 tokens, gradients accumulated over 4 micro-batches
# like the trainer), AdamW. Runs where PyTorch and transformers are installed
# (a throwaway virtual environment, or the GPU machine's own); not part of the
# product or its tests. Prints one line per precision:
#   precision, median step seconds, tokens/s, MFU against --peak.
#
#   python3 bench/pytorch_llama_baseline.py --precisions bf16 fp32 tf32 --steps 10
import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def model_flops_per_token(cfg, seq):
    # Same accounting as the trainer (model/model_shape.h layer_flops_per_token):
    # 6 x matmul parameters per token plus causal attention, and the LM head.
    H, F, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    d = H // cfg.num_attention_heads
    qdim, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    matmul = H * (qdim + 2 * kv) + qdim * H + 3 * H * F
    layer = 6.0 * matmul + 6.0 * qdim * (seq + 1.0)
    return L * layer + 6.0 * V * H


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--precisions", nargs="+", default=["bf16"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--peak", type=float, default=989e12)
    a = p.parse_args()
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=a.seq,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 32000, (1, a.seq), generator=g).cuda() for _ in range(a.micro_batches)]
    flops = model_flops_per_token(cfg, a.seq) * a.seq * a.micro_batches
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for precision in a.precisions:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).cuda()
        if precision == "bf16":
            # Mixed precision as the trainer's issue defines it: fp32 master weights, bf16 compute.
            ctx = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
        else:
            import contextlib
            ctx = contextlib.nullcontext
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        times = []
        for step in range(a.steps + 2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for x in batches:
                with ctx():
                    loss = model(input_ids=x, labels=x).loss / a.micro_batches
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if step >= 2:
                times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        peak_mem = torch.cuda.max_memory_allocated() / 2**30
        print(f"pytorch-hf {precision}: step {med:.3f} s, {a.seq * a.micro_batches / med:,.0f} tokens/s, "
              f"MFU {flops / med / a.peak:.3f} (of {a.peak / 1e12:.0f} TFLOP/s), peak memory {peak_mem:.1f} GiB, "
              f"last loss {loss.item() * a.micro_batches:.3f}")
        del model, opt
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
