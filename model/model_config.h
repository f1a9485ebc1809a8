#pragma once
// The shape of a LLaMA-family model. Plain data: the model library needs
// nothing else from the configuration.

#include <cstdint>
#include <string>

#include "model/model_shape.h"

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
    return s;
  }
};

}  // namespace hdp
