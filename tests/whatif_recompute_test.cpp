// Activation recomputation in the planner's memory model and the step simulator
// (whatif/step_simulation.h, planning/cost_model.h), worked by hand for a small
// model: the capacity C each mode's saved bytes allow, the step time its rerun
// forward adds to backward, for a local micro-batch and for a ring, and what full
// recomputation reruns (spec/model_shape.h recompute_flops).

#include <gtest/gtest.h>

#include <vector>

#include "planning/plan.h"
#include "planning/step_bound.h"
#include "whatif/step_simulation.h"

namespace hdp {
namespace {

// 4 layers, hidden 64, 4 heads of 16 over 2 KV heads (q 64, kv 32), FFN 128,
// vocabulary 256, untied. Parameters: a layer 64 x (64 + 64) + 64 x 64 + 3 x 64 x
// 128 + 2 x 64 = 36,992; embedding 16,384; head 16,384 + 64; all 180,800.
ModelShape small_model() {
  ModelShape m;
  m.name = "small";
  m.layers = 4;
  m.hidden = 64;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.ffn = 128;
  m.vocab = 256;
  return m;
}

constexpr double kParameters = 180'800;
// Weights and gradients (2 + 4 bytes) and the whole optimizer shard (12, hdp 1).
constexpr double kStaticBytes = 18 * kParameters;
// Room for 1,000 tokens of 4 layers without recomputation (1,432 B each, below).
constexpr double kFreeBytes = 1000.0 * 4 * 1432;

// 0.5 TFLOP/s, no small-kernel slowdown, weights and free bytes as above.
HardwareProfile small_gpu() {
  HardwareProfile hw;
  hw.peak_flops = 1e12;
  hw.achievable_fraction = 0.5;
  hw.reserved_bytes = 1e6;
  hw.hbm_bytes = hw.reserved_bytes + kStaticBytes + kFreeBytes;
  hw.hbm_bytes_per_s = 1e12;
  hw.nvlink_bytes_per_s = hw.internode_bytes_per_s = hw.pcie_bytes_per_s = 1e10;
  return hw;
}

const RecomputeMode kModes[] = {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full};

// Saved bytes per token and layer in bf16 (2 B per row value, 4 per small one):
//   none: rows 4 x 64 + 2 x 64 + 2 x 32 + 2 x 128 = 704, small 2 + 4 heads: 1,432 B;
//   selective: rows 2 x 64 + 2 x 64 + 2 x 32 + 2 x 128 = 576, small 4: 1,168 B;
//   full: the input and, as a ring layer, the attention output (64 + 64), small 4:
//   272 B (the capacity holds any micro-batch, rings included).
// C = floor(free / (1 in flight x 4 layers x bytes)): 1,000, 1,226, 5,264.
TEST(RecomputeMemory, CapacityOfEachMode) {
  const ModelShape m = small_model();
  const HardwareProfile hw = small_gpu();
  const std::vector<int64_t> split = {4};
  const double bytes[] = {1432, 1168, 272};
  const int64_t capacity[] = {1000, 1226, 5264};
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(model_costs(m, 1, 1, kModes[i]).saved_bytes_per_token, bytes[i]) << i;
    const MemoryBudget b = memory_budget(m, hw, {1, 1, 1}, split, 1, kModes[i]);
    EXPECT_DOUBLE_EQ(b.static_bytes[0], kStaticBytes);
    EXPECT_EQ(b.capacity, capacity[i]) << i;
    EXPECT_DOUBLE_EQ(make_step_costs(m, hw, {1, 1, 1}, split, 1, kModes[i]).cost.a2, bytes[i]) << i;
  }
}

// One micro-batch of one 1,000-token sequence on one GPU. Per layer and token the
// matmuls cost 6 x (64 x 128 + 64 x 64 + 3 x 64 x 128) = 221,184 FLOPs forward +
// backward and attention 12 x 64 = 768 per (query, key) pair, of which there are
// 1000 x 1001 / 2 = 500,500; the head 6 x 256 x 64 = 98,304 per token:
//   4 x (221,184 x 1000 + 768 x 500,500) + 98,304 x 1000 = 2,520,576,000 FLOPs.
// Full recomputation reruns q, k, v, o (2 x (64 x 128 + 64 x 64) = 24,576 per token),
// gate and up (2 x 2 x 64 x 128 = 32,768) and attention (4 x 64 = 256 per pair):
//   4 x (57,344 x 1000 + 256 x 500,500) = 741,888,000 FLOPs more in backward.
// Selective reruns the norms only, which the counts leave out. The tail is the
// optimizer alone (one rank: no collective): 32 B x 180,800 at 1 TB/s.
TEST(RecomputeStep, LocalMicroBatchUnderEachMode) {
  const ModelShape m = small_model();
  const HardwareProfile hw = small_gpu();
  const std::vector<int64_t> split = {4}, lengths = {1000};
  StepPlan plan;
  plan.capacity = 1000;
  plan.ranks = {{PlannedMicroBatch{{{0, 0, 1000, -1}}, -1, 0}}};
  const double rate = 0.5e12, optimizer = 32 * kParameters / 1e12;
  const double flops[] = {2'520'576'000.0, 2'520'576'000.0, 2'520'576'000.0 + 741'888'000.0};
  for (int i = 0; i < 3; ++i) {
    const StepCosts k = make_step_costs(m, hw, {1, 1, 1}, split, 1, kModes[i]);
    EXPECT_DOUBLE_EQ(gradient_sync(k, 0).seconds(), optimizer);
    const StepSimulation s = simulate_step(plan, lengths, k);
    EXPECT_NEAR(s.step_seconds, flops[i] / rate + optimizer, 1e-15) << i;
    EXPECT_NEAR(s.compute_seconds, flops[i] / rate, 1e-15) << i;
  }
}

// Two GPUs share one 2,000-token sequence as a ring (1,000 tokens each). A ring
// layer under full recomputation keeps its attention output, so it reruns the
// per-token 57,344 FLOPs only: 4 layers x 57,344 x 1,000 = 229,376,000 FLOPs more
// per member, in its backward, and the step grows by exactly that (both members
// alike, the ring transfers unchanged); selective adds nothing. The lower bound
// (planning/step_bound.h) counts that much and stays below every step.
TEST(RecomputeStep, RingMicroBatchKeepsItsAttention) {
  const ModelShape m = small_model();
  HardwareProfile hw = small_gpu();
  hw.hbm_bytes += kFreeBytes;  // room for two ranks' shares of the optimizer
  const std::vector<int64_t> split = {4}, lengths = {2000};
  StepPlan plan;
  plan.capacity = 1000;
  plan.rings.push_back({{0, 1}, {0}});
  plan.ranks.resize(2);
  for (int j = 0; j < 2; ++j)
    plan.ranks[j].push_back(PlannedMicroBatch{zigzag_ring_pieces(plan.rings[0], 0, j, lengths), 0, 0});
  check_plan(plan, lengths, 4, 1);
  double step[3];
  for (int i = 0; i < 3; ++i) {
    const StepCosts k = make_step_costs(m, hw, {1, 1, 2}, split, 1, kModes[i]);
    step[i] = simulate_step(plan, lengths, k).step_seconds;
    PlannerSettings st;
    st.hdp = 2;
    st.capacity = 1000;
    st.layers_per_stage = 4;
    st.cost = k.cost;
    st.cost.head_seconds_per_token = k.head_seconds_per_token;
    const std::vector<double> tail = {gradient_sync(k, 0).seconds()};
    EXPECT_LE(step_lower_bound(lengths, st, split, tail).seconds(), step[i]) << i;
  }
  EXPECT_DOUBLE_EQ(step[1], step[0]);
  EXPECT_NEAR(step[2] - step[0], 4 * 57'344.0 * 1000 / 0.5e12, 1e-15);
}

// A micro-batch that recomputes some layers of a stage that does not
// (PlannedMicroBatch::recompute_layers, priced by StepCosts::recomputed): the
// 1,000-token micro-batch above with 2 of its 4 layers under full adds half of full's
// 741,888,000 FLOPs to backward, with all 4 exactly full's step. Its recomputed layers
// offload nothing: at ratio 0.5 with 1 of 4 layers recomputed only layer 1 (of the
// first l - 2) copies, 0.5 x 1,432 B x 1,000 tokens.
TEST(RecomputeStep, MicroBatchRecomputingSomeLayers) {
  const ModelShape m = small_model();
  const HardwareProfile hw = small_gpu();
  const std::vector<int64_t> split = {4}, lengths = {1000};
  StepCosts k = make_step_costs(m, hw, {1, 1, 1}, split, 1, RecomputeMode::None);
  k.recomputed = make_step_costs(m, hw, {1, 1, 1}, split, 1, RecomputeMode::Full).cost;
  const double rate = 0.5e12, optimizer = 32 * kParameters / 1e12;
  StepPlan plan;
  plan.capacity = 1000;
  plan.ranks = {{PlannedMicroBatch{{{0, 0, 1000, -1}}, -1, 0}}};
  for (int64_t layers : {0, 2, 4}) {
    plan.ranks[0][0].recompute_layers = layers;
    const double flops = 2'520'576'000.0 + 741'888'000.0 * static_cast<double>(layers) / 4;
    const StepSimulation s = simulate_step(plan, lengths, k);
    EXPECT_NEAR(s.step_seconds, flops / rate + optimizer, 1e-15) << layers;
    EXPECT_NEAR(s.compute_seconds, flops / rate, 1e-15) << layers;
  }
  plan.ranks[0][0].recompute_layers = 1;
  plan.ranks[0][0].offload_ratio = 0.5;
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).offloaded_bytes, 0.5 * 1432 * 1000);
  plan.ranks[0][0].recompute_layers = 0;
  EXPECT_DOUBLE_EQ(simulate_step(plan, lengths, k).offloaded_bytes, 0.5 * 2 * 1432 * 1000);
}

// What full recomputation reruns per token and pair at tp 2 (q 32, kv 16, FFN 64 per
// rank): q, k, v, o 2 x (64 x (32 + 32) + 32 x 64) = 12,288 FLOPs, gate and up
// 2 x 2 x 64 x 64 = 16,384, attention 4 x 32 = 128 per pair; a ring layer no
// attention; a mixture of experts (8 of size 128, top 2) keeps its experts' and
// router's outputs, so only the projections; selective and none nothing.
TEST(RecomputeFlopsTest, WhatEachModeReruns) {
  ModelShape m = small_model();
  const RecomputeFlops local = recompute_flops(m, 2, RecomputeMode::Full);
  EXPECT_DOUBLE_EQ(local.per_token, 12'288 + 16'384);
  EXPECT_DOUBLE_EQ(local.per_pair, 128);
  const RecomputeFlops ring = recompute_flops(m, 2, RecomputeMode::Full, true);
  EXPECT_DOUBLE_EQ(ring.per_token, 12'288 + 16'384);
  EXPECT_DOUBLE_EQ(ring.per_pair, 0);
  for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective}) {
    EXPECT_DOUBLE_EQ(recompute_flops(m, 2, mode).per_token, 0);
    EXPECT_DOUBLE_EQ(recompute_flops(m, 2, mode).per_pair, 0);
  }
  m.experts = 8;
  m.experts_per_token = 2;
  EXPECT_DOUBLE_EQ(recompute_flops(m, 2, RecomputeMode::Full).per_token, 12'288);
  EXPECT_DOUBLE_EQ(recompute_flops(m, 2, RecomputeMode::Full).per_pair, 128);
}

}  // namespace
}  // namespace hdp
