#pragma once
// The cost model of data-aware sharding and selective offload (ByteScale: Ge et
// al., 2025, the communication optimizer's sections on data-aware sharding and
// selective offloading): per transformer layer, the compute time of a
// sequence of s tokens (forward and backward) and the bytes of activations it
// saves for backward.

#include <cstdint>

namespace hdp {

struct CostModel {
  double a1 = 0, b1 = 0, g = 0;  // T(s) = a1 s^2 + b1 s + g seconds
  double a2 = 0, b2 = 0;         // Act(s) = a2 s + b2 bytes
  double d2h_bytes_per_s = 0, h2d_bytes_per_s = 0;
  // Forward and backward per token of the parts outside the layers: on the first
  // pipeline stage the embedding, on the last the final norm, LM head and loss.
  double embedding_seconds_per_token = 0;
  double head_seconds_per_token = 0;

  // One layer's forward and backward over a sequence of s tokens.
  double compute_seconds(int64_t s) const;
  // One layer's saved activations for a sequence of s tokens.
  double activation_bytes(int64_t s) const;
};

// The shape of one transformer layer as the cost model needs it (the planner
// layer does not depend on the model).
struct LayerShape {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0;
  int64_t saved_floats_per_token = 0;  // floats one layer keeps for backward, per token
};

// FLOP counts at a fixed rate. With qdim = heads * head_dim, one layer's forward
// and backward over s tokens costs 6 * matmul_params * s (projections and MLP,
// matmul_params = hidden (qdim + 2 kv_heads head_dim) + qdim hidden + 3 hidden ffn)
// plus 6 * qdim * s (s + 1) (causal attention scores and values), so
// a1 = 6 qdim / rate, b1 = (6 matmul_params + 6 qdim) / rate, g = 0;
// a2 = 4 bytes * saved_floats_per_token, b2 = 0; both copy directions at copy_bytes_per_second.
CostModel analytic_cost_model(const LayerShape& shape, double flops_per_second, double copy_bytes_per_second);

}  // namespace hdp
