#pragma once
// The shape of a LLaMA-family model. Plain data: the model library needs
// nothing else from the configuration.

#include <cstdint>
#include <optional>
#include <string>

#include "spec/model_shape.h"
#include "spec/rope.h"

namespace hdp {

// RopeSettings: model.rope_theta and the RoPE scaling keys (spec/rope.h).
struct ModelConfig : RopeSettings {
  std::string arch = "llama";
  int64_t vocab_size = 258;
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 4;
  int64_t ffn_hidden_size = 352;
  double norm_eps = 1e-5;
  bool tie_embeddings = false;
  double init_std = 0.02;
  // Mistral's sliding window (Jiang et al. 2023, "Mistral 7B"): a query at position i
  // sees the keys at positions i - W < j <= i. Empty: full causal attention (LLaMA,
  // and Mistral checkpoints whose Hugging Face config says sliding_window: null).
  std::optional<int64_t> sliding_window;
  // Mixtral (Jiang et al. 2024, "Mixtral of Experts"), arch "mixtral" only: the sparse
  // MoE block replaces the MLP (model/moe.h); Hugging Face num_local_experts,
  // num_experts_per_tok and router_aux_loss_coef (its defaults).
  int64_t num_experts = 8;
  int64_t experts_per_token = 2;
  double router_aux_loss_coef = 0.001;
  bool moe() const { return arch == "mixtral"; }

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t kv_dim() const { return num_kv_heads * head_dim(); }
  // The window as the attention kernels take it: 0 (kNoWindow) when there is none.
  int64_t attention_window() const { return sliding_window.value_or(0); }
  // Its counts (parameters, FLOPs, saved activations) are those of this shape.
  ModelShape shape() const {
    ModelShape s;
    s.name = arch;
    s.layers = num_layers;
    s.hidden = hidden_size;
    s.heads = num_heads;
    s.kv_heads = num_kv_heads;
    s.head_dim = head_dim();
    s.ffn = ffn_hidden_size;
    s.vocab = vocab_size;
    s.tied_embeddings = tie_embeddings;
    s.window = attention_window();
    if (moe()) {
      s.experts = num_experts;
      s.experts_per_token = experts_per_token;
    }
    return s;
  }
};

}  // namespace hdp
