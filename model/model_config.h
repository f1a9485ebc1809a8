#pragma once
// The shape of a LLaMA-family model. Plain data: the model library needs
// nothing else from the configuration.

#include <cstdint>
#include <string>

namespace hdp {

struct ModelConfig {
  std::string arch = "llama";
  int64_t vocab_size = 258;
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 4;
  int64_t ffn_hidden_size = 352;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tie_embeddings = false;
  double init_std = 0.02;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t kv_dim() const { return num_kv_heads * head_dim(); }
};

}  // namespace hdp
