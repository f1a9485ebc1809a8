#pragma once
// Fixtures shared by the planner tests.

#include <cstdint>
#include <vector>

#include "spec/model_shape.h"
#include "planning/plan.h"

namespace hdp::testing {

// Sequences 0 (10 tokens, a ring over ranks 0 and 1), 1 (4, local on rank 0) and
// 2 (3, local on rank 1).
inline StepPlan hand_plan() {
  StepPlan p;
  p.capacity = 10;
  p.rings = {Ring{{0, 1}, {0}}};
  PlannedMicroBatch a;
  a.ring = 0;
  a.pieces = {{1, 0, 4, -1}, {0, 0, 2, 0}, {0, 7, 3, 0}};
  PlannedMicroBatch b;
  b.ring = 0;
  b.pieces = {{2, 0, 3, -1}, {0, 2, 3, 0}, {0, 5, 2, 0}};
  p.ranks = {{a}, {b}};
  return p;
}
inline const std::vector<int64_t> kHandLengths = {10, 4, 3};

// A small LLaMA layer for the FLOP-derived cost model: hidden 512, 8 heads of 64
// over 4 KV heads, FFN 1376.
inline const ModelShape kSmallLayer{.name = "small", .hidden = 512, .heads = 8, .kv_heads = 4, .head_dim = 64, .ffn = 1376};

}  // namespace hdp::testing
