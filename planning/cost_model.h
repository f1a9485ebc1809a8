#pragma once
// The cost model of data-aware sharding and selective offload (ByteScale: Ge et
// al., 2025, the communication optimizer's sections on data-aware sharding and
// selective offloading): per transformer layer, the compute time of a
// sequence of s tokens (forward and backward) and the bytes of activations it
// saves for backward.

#include <cstdint>

#include "spec/model_shape.h"

namespace hdp {

struct CostModel {
  // T(s) = a1 s^2 + b1 s + g seconds; under a sliding window W (Mistral: Jiang et al.
  // 2023) s^2 becomes attention_term(s), so T grows linearly past W.
  double a1 = 0, b1 = 0, g = 0;
  int64_t window = 0;  // the model's sliding window; 0: none
  // Activation recomputation (spec/model_shape.h, recompute_flops): the forward a
  // recomputed layer reruns at the start of its backward, R(s) = ra attention_term(s)
  // + rb s seconds for a local sequence, rb_ring s for a ring member's s tokens (a
  // ring layer keeps its attention output). All 0 without recomputation.
  double ra = 0, rb = 0, rb_ring = 0;
  double a2 = 0, b2 = 0;         // Act(s) = a2 s + b2 bytes
  double d2h_bytes_per_s = 0, h2d_bytes_per_s = 0;
  // Forward and backward per token of the parts outside the layers: on the first
  // pipeline stage the embedding, on the last the final norm, LM head and loss.
  double embedding_seconds_per_token = 0;
  double head_seconds_per_token = 0;

  // One layer's forward and backward over a sequence of s tokens.
  double compute_seconds(int64_t s) const;
  // What a1 multiplies: s^2 without a window; with one, 2 P(s) - s where P(s) =
  // attention_pairs(s, W) (spec/model_shape.h) is the number of visible (query, key)
  // pairs, which is s^2 again for s <= W. So a1 (2 P(s) - s) + b1 s is exactly the
  // attention FLOPs per pair times P(s) plus the matmuls per token times s (below).
  double attention_term(int64_t s) const;
  // R(s) above, what recomputation adds to compute_seconds (which leaves it out).
  double recompute_seconds(int64_t s, bool ring) const;
  // One layer's saved activations for a sequence of s tokens.
  double activation_bytes(int64_t s) const;
};

// Prices recomputation: ra, rb and rb_ring become `share` times what one layer
// reruns under `mode` on one rank of tp (recompute_flops: R(s) = per-pair FLOPs
// attention_term(s) / 2 + (per-token + per-pair / 2) s locally, per-token s in a ring)
// at flops_per_second. share: the fraction of a stage's layers that recompute, so
// that the planners' l R(s) per stage charges the k = share l of them that do.
void price_recomputation(CostModel& cost, const ModelShape& model, int tp, RecomputeMode mode,
                         double flops_per_second, double share = 1);

// The FLOP rate a model's linear term implies for one layer on one rank of tp: its
// FLOPs per token, matmuls and half a pair's attention, over b1 (analytic_cost_model's
// rate; a profiled model's measured one). 0 when b1 is not positive.
double implied_flops_per_second(const CostModel& cost, const ModelShape& model, int tp);

// The FLOP counts of one layer on one rank of a tensor-parallel group of tp
// (spec/model_shape.h) at a fixed rate. Over a causal sequence of s tokens the
// layer costs matmul s + attention P(s) FLOPs (matmul per token, attention per
// (query, visible key) pair; P(s) = s (s + 1) / 2 without a window), so
// a1 = attention / 2 / rate, b1 = (matmul + attention / 2) / rate, g = 0;
// a2 = saved_bytes_per_token, b2 = 0; both copy directions at copy_bytes_per_second;
// ra, rb and rb_ring by price_recomputation at that rate.
// The embedding and the head are the caller's. The shape must split over tp
// (validate_split). The window is the shape's.
CostModel analytic_cost_model(const ModelShape& model, int tp, double saved_bytes_per_token, double flops_per_second,
                              double copy_bytes_per_second, RecomputeMode recompute = RecomputeMode::None);

}  // namespace hdp
