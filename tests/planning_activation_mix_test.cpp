// Offload and recomputation as alternatives per layer (planning/activation_mix.h) on
// hand-computed cases: a stage of l = 10 layers, capacity C = 100 tokens (a budget of
// l C = 1,000 whole-layer tokens), a whole layer saving 1 byte per token, a recomputed
// one 0.25 of it, copies at 100 bytes/s both ways, forward a third of the compute.

#include <gtest/gtest.h>

#include <stdexcept>

#include "planning/activation_mix.h"
#include "planning/plan.h"

namespace hdp {
namespace {

// R(s) = rerun_per_token s for a recomputed layer.
ActivationMixSettings settings(int64_t max_layers, double rerun_per_token) {
  ActivationMixSettings s;
  s.capacity = 100;
  s.layers = 10;
  s.cost.a2 = 1;
  s.cost.d2h_bytes_per_s = s.cost.h2d_bytes_per_s = 100;
  s.recompute.max_layers = max_layers;
  s.recompute.recomputed.a2 = 0.25;
  s.recompute.recomputed.rb = rerun_per_token;
  s.recompute.recomputed.rb_ring = rerun_per_token;
  return s;
}

TEST(ActivationMix, TokenLimitCountsRecomputedLayersAtTheirShare) {
  // ByteScale's limit without recomputation: 1000 / (2 + 8 x 0.5).
  EXPECT_EQ(max_micro_batch_tokens(100, 10, 0.5), 166);
  // 7 recomputed layers at 0.25, the last two whole, one more whole: 1000 / 4.75.
  EXPECT_EQ(max_micro_batch_tokens(100, 10, 0.0, 7, 0.25), 210);
  // 6 recomputed, 2 offloaded at 0.25, 2 whole: 1000 / (1.5 + 1.5 + 2).
  EXPECT_EQ(max_micro_batch_tokens(100, 10, 0.25, 6, 0.25), 200);
  // Every layer recomputed: 1000 / 2.5.
  EXPECT_EQ(max_micro_batch_tokens(100, 10, 0.0, 10, 0.25), 400);
  EXPECT_THROW(max_micro_batch_tokens(100, 10, 0.0, 11, 0.25), std::invalid_argument);
  EXPECT_THROW(max_micro_batch_tokens(100, 10, 0.0, 1, 0.0), std::invalid_argument);
}

TEST(ActivationMix, WithinTheCapacityNothingChanges) {
  const auto mix = choose_activation_mix(100, false, 0.001, settings(10, 1));
  ASSERT_TRUE(mix);
  EXPECT_EQ(mix->recompute_layers, 0);
  EXPECT_EQ(mix->offload_ratio, 0);
  EXPECT_EQ(mix->seconds, 0);
}

TEST(ActivationMix, HiddenOffloadIsFreeAndWins) {
  // 200 tokens need 2 + 8 (1 - r) <= 5 whole layers: r = 0.625, 125 bytes a layer,
  // 1.25 s each way under 10 / 3 s of forward and 20 / 3 s of backward: free. Any
  // recomputed layer costs R(200) = 0.2 s.
  const auto mix = choose_activation_mix(200, false, 10, settings(10, 0.001));
  ASSERT_TRUE(mix);
  EXPECT_EQ(mix->recompute_layers, 0);
  EXPECT_DOUBLE_EQ(mix->offload_ratio, 0.625);
  EXPECT_EQ(mix->seconds, 0);
}

TEST(ActivationMix, ExposedCopiesLoseToRecomputation) {
  // The layer computes 0.3 s (0.1 forward, 0.2 backward). Offload alone: r = 0.625,
  // 1.25 s copies, (1.15 + 1.05) x 8 = 17.6 s exposed. 7 recomputed layers hold
  // 1.75 + 3 = 4.75 <= 5 without offload: 7 x 0.2 = 1.4 s. 6 of them need r = 0.25 on
  // two layers, (0.4 + 0.3) x 2 exposed: 2.6 s; 8 cost 1.6 s.
  const ActivationMixSettings s = settings(10, 0.001);
  EXPECT_NEAR(activation_mix_seconds(200, false, 0.3, {0, 0.625, 0}, s), 17.6, 1e-12);
  EXPECT_NEAR(activation_mix_seconds(200, false, 0.3, {6, 0.25, 0}, s), 2.6, 1e-12);
  // The copy terms alone (what the planners charge an offloaded micro-batch beyond
  // its rerun): the 6 recomputed layers' 6 x 0.2 = 1.2 s leave 1.4 s.
  EXPECT_NEAR(activation_copy_seconds(200, 0.3, {6, 0.25, 0}, s), 1.4, 1e-12);
  EXPECT_NEAR(activation_copy_seconds(200, 0.3, {0, 0.625, 0}, s), 17.6, 1e-12);
  // Copies that hide under their layer's forward and backward add nothing; no copies, nothing.
  EXPECT_EQ(activation_copy_seconds(200, 10, {0, 0.625, 0}, s), 0);
  EXPECT_EQ(activation_copy_seconds(200, 0.3, {7, 0, 0}, s), 0);
  const auto mix = choose_activation_mix(200, false, 0.3, s);
  ASSERT_TRUE(mix);
  EXPECT_EQ(mix->recompute_layers, 7);
  EXPECT_EQ(mix->offload_ratio, 0);
  EXPECT_NEAR(mix->seconds, 1.4, 1e-12);
  // Recomputation not allowed: the exposed offload is what fits.
  const auto offload_only = choose_activation_mix(200, false, 0.3, settings(0, 0.001));
  ASSERT_TRUE(offload_only);
  EXPECT_EQ(offload_only->recompute_layers, 0);
  EXPECT_NEAR(offload_only->seconds, 17.6, 1e-12);
}

TEST(ActivationMix, HostMemoryMakesBothNeeded) {
  // 300 tokens: k 0.25 + 2 + m (1 - r) <= 10/3 whole layers, at most 6 layers recompute,
  // at most 1,200 bytes offloaded. k = 0..3 need r = 5/6, 0.845, 0.861, 0.883: 2,000 to
  // 1,325 bytes; k = 4 needs r = 11/12 of 4 layers, 1,100 bytes, 4 x R(300) = 1.2 s;
  // k = 5 costs 1.5 s; k = 6 holds 3.5 whole layers even at r = 1.
  ActivationMixSettings s = settings(6, 0.001);
  s.host_bytes = 1200;
  const auto mix = choose_activation_mix(300, false, 100, s);
  ASSERT_TRUE(mix);
  EXPECT_EQ(mix->recompute_layers, 4);
  EXPECT_NEAR(mix->offload_ratio, 11.0 / 12.0, 1e-9);
  EXPECT_NEAR(mix->seconds, 1.2, 1e-12);
  EXPECT_LE(300, max_micro_batch_tokens(100, 10, mix->offload_ratio, 4, 0.25));
  // Unbounded host memory: offload alone, hidden, r = 5/6.
  s.host_bytes = 0;
  const auto free = choose_activation_mix(300, false, 100, s);
  ASSERT_TRUE(free);
  EXPECT_EQ(free->recompute_layers, 0);
  EXPECT_NEAR(free->offload_ratio, 5.0 / 6.0, 1e-9);
}

TEST(ActivationMix, NothingFits) {
  // The most a stage holds: everything offloaded but two whole layers, 1000 / 2 = 500.
  const ActivationMixSettings s = settings(10, 0.001);
  ASSERT_TRUE(choose_activation_mix(500, false, 100, s));
  EXPECT_FALSE(choose_activation_mix(501, false, 100, s));
  // Without offload, every layer recomputed: 1000 / 2.5 = 400, at 10 x R(400) = 4 s.
  ActivationMixSettings no_offload = s;
  no_offload.offload = false;
  const auto all = choose_activation_mix(400, false, 100, no_offload);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->recompute_layers, 10);
  EXPECT_NEAR(all->seconds, 4, 1e-12);
  EXPECT_FALSE(choose_activation_mix(401, false, 100, no_offload));
  // Neither: only the capacity.
  ActivationMixSettings neither = settings(0, 0.001);
  neither.offload = false;
  EXPECT_FALSE(choose_activation_mix(101, false, 100, neither));
}

}  // namespace
}  // namespace hdp
