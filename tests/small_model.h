#pragma once
// The model the model-level tests share: 4 layers (enough for layers that recompute,
// offload or sit on two pipeline stages), 4 query and 2 KV heads (tp 2 splits every
// layer; GQA), a vocabulary and widths small enough for exhaustive comparisons.

#include "spec/model_config.h"

namespace hdp::testing {

inline ModelConfig small_model_config() {
  ModelConfig c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 48;
  c.init_std = 0.1;
  return c;
}

}  // namespace hdp::testing
