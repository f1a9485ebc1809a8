# The PyTorch comparison for our benchmark shapes: Hugging Face LlamaForCausalLM
# (attn_implementation="sdpa"), same shape and tokens per step as the trainer, AdamW.
#   --shape bench-llama-1b (GPU, configs/bench-llama-1b.yaml): 4 micro-batches of one
#     4096-token sequence, gradients accumulated like the trainer's.
#   --shape bench-llama (CPU, configs/bench-llama.yaml and build/bench/train_step_bench):
#     one micro-batch of 4 sequences of 1024 tokens.
# Runs where PyTorch and transformers are installed (a throwaway virtual environment,
# or the GPU machine's own); not part of the product or its tests. Prints one line per
# precision (and per mode: eager, and torch.compile with --compile): median step
# seconds, tokens/s, MFU against --peak.
#
#   python3 bench/pytorch_llama_baseline.py --precisions bf16 fp32 tf32 --steps 10
#   python3 bench/pytorch_llama_baseline.py --device cpu --shape bench-llama --precisions fp32 --steps 3 --compile
import argparse
import contextlib
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    # hidden, ffn, layers, heads, kv heads, sequence length, sequences per micro-batch, micro-batches
    "bench-llama-1b": (2048, 5632, 16, 16, 8, 4096, 1, 4),
    "bench-llama": (512, 1376, 8, 8, 4, 1024, 4, 1),
}


def model_flops_per_token(cfg, seq):
    # Same accounting as the trainer (spec/model_shape.h layer_flops_per_token):
    # 6 x matmul parameters per token plus causal attention, and the LM head.
    H, F, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    d = H // cfg.num_attention_heads
    qdim, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    matmul = H * (qdim + 2 * kv) + qdim * H + 3 * H * F
    layer = 6.0 * matmul + 6.0 * qdim * (seq + 1.0)
    return L * layer + 6.0 * V * H


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--shape", default="bench-llama-1b", choices=sorted(SHAPES))
    p.add_argument("--precisions", nargs="+", default=["bf16"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="also time torch.compile(model)")
    p.add_argument("--peak", type=float, default=989e12)
    a = p.parse_args()
    hidden, ffn, layers, heads, kv_heads, seq, seqs, micro_batches = SHAPES[a.shape]
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 32000, (seqs, seq), generator=g).to(dev) for _ in range(micro_batches)]
    tokens = seq * seqs * micro_batches
    flops = model_flops_per_token(cfg, seq) * tokens
    where = torch.cuda.get_device_name() if a.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, shape {a.shape}")
    modes = ["eager"] + (["compile"] if a.compile else [])
    for precision in a.precisions:
        for mode in modes:
            if a.device == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                torch.backends.cudnn.allow_tf32 = precision == "tf32"
            torch.manual_seed(0)
            model = LlamaForCausalLM(cfg).to(dev)
            run = torch.compile(model) if mode == "compile" else model
            if precision == "bf16":
                # Mixed precision as the trainer's issue defines it: fp32 master weights, bf16 compute.
                ctx = lambda: torch.autocast(a.device, dtype=torch.bfloat16)
            else:
                ctx = contextlib.nullcontext
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                    fused=a.device == "cuda")
            times = []
            for step in range(a.steps + a.warmup):
                sync()
                t0 = time.perf_counter()
                for x in batches:
                    with ctx():
                        loss = run(input_ids=x, labels=x).loss / micro_batches
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                sync()
                if step >= a.warmup:
                    times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            memory = (f", peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
                      if a.device == "cuda" else "")
            print(f"pytorch-hf {precision} {mode}: step {med:.3f} s, {tokens / med:,.0f} tokens/s, "
                  f"model GFLOP/s {flops / med / 1e9:.1f}, MFU {flops / med / a.peak:.3f} "
                  f"(of {a.peak / 1e12:.3g} TFLOP/s){memory}, last loss {loss.item() * micro_batches:.3f}",
                  flush=True)
            del model, run, opt
            if a.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
