#pragma once
// The cost model of data-aware sharding and selective offload (ByteScale: Ge et
// al., 2025, the communication optimizer's sections on data-aware sharding and
// selective offloading): per transformer layer, the compute time of a
// sequence of s tokens (forward and backward) and the bytes of activations it
// saves for backward.

#include <cstdint>

#include "model/model_shape.h"

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

// The FLOP counts of one layer on one rank of a tensor-parallel group of tp
// (model/model_shape.h) at a fixed rate. Over a causal sequence of s tokens the
// layer costs matmul s + attention s (s + 1) / 2 FLOPs (matmul per token,
// attention per (query, visible key) pair), so
// a1 = attention / 2 / rate, b1 = (matmul + attention / 2) / rate, g = 0;
// a2 = saved_bytes_per_token, b2 = 0; both copy directions at copy_bytes_per_second.
// The embedding and the head are the caller's. The shape must split over tp
// (validate_split).
CostModel analytic_cost_model(const ModelShape& model, int tp, double saved_bytes_per_token, double flops_per_second,
                              double copy_bytes_per_second);

}  // namespace hdp
