// The step's lower bound (planning/step_bound.h) on hand-computed cases: work over
// the ranks, the longest sequence through every pipeline stage, the offload memory
// forces on it, the gradient sync after each, a sliding window.

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "planning/plan.h"
#include "planning/step_bound.h"

namespace hdp {
namespace {

// T(s) = a1 s^2 + b1 s per layer; the head costs head seconds per token.
PlannerSettings settings(int hdp, int64_t capacity, int64_t layers, int stages, double a1, double b1,
                         double head = 0) {
  PlannerSettings s;
  s.hdp = hdp;
  s.capacity = capacity;
  s.layers_per_stage = layers;
  s.pipeline_stages = stages;
  s.cost.a1 = a1;
  s.cost.b1 = b1;
  s.cost.a2 = 1;  // one byte per token and layer
  s.cost.d2h_bytes_per_s = s.cost.h2d_bytes_per_s = 100;
  s.cost.head_seconds_per_token = head;
  return s;
}

TEST(StepBound, WorkOverTheRanks) {
  // T(4) = 16 + 8, T(2) = 4 + 4: 40 s per layer, 80 over 2 layers, and 8 tokens of
  // head at 0.5: 84 s of work over 4 ranks. The 4-token sequence over 4 ranks: 1 token
  // each, 16 / 4 + 2 per layer, 12.5 s with its head.
  const std::vector<int64_t> lengths = {4, 2, 2};
  const std::vector<int64_t> layers = {2};
  StepBound b = step_lower_bound(lengths, settings(4, 10, 2, 1, 1, 2, 0.5), layers);
  EXPECT_DOUBLE_EQ(b.work, 21);
  EXPECT_DOUBLE_EQ(b.longest, 12.5);
  EXPECT_EQ(b.member_tokens, 1);
  EXPECT_EQ(b.ranks, 4);
  EXPECT_DOUBLE_EQ(b.offload, 0);
  EXPECT_DOUBLE_EQ(b.seconds(), 21);
  // The gradient sync follows both.
  const std::vector<double> tail = {1.5};
  b = step_lower_bound(lengths, settings(4, 10, 2, 1, 1, 2, 0.5), layers, tail);
  EXPECT_DOUBLE_EQ(b.work, 22.5);
  EXPECT_DOUBLE_EQ(b.longest, 14);
  // No sequences: the gradient sync alone.
  b = step_lower_bound(std::vector<int64_t>{}, settings(4, 10, 2, 1, 1, 2, 0.5), layers, tail);
  EXPECT_DOUBLE_EQ(b.seconds(), 1.5);
}

TEST(StepBound, TheLongestSequencePassesEveryStage) {
  // One rank, stages of 2 and 4 layers, one sequence of 10 tokens: T(10) = 120 per
  // layer. The busiest stage works 4 x 120 + 10 x 0.5 (head) = 485 s, but the
  // sequence's micro-batch passes stage 0 (240 s and 10 x 0.25 of embedding) before
  // stage 1 and back through it after: 727.5 s, pipeline fill and drain.
  PlannerSettings st = settings(1, 100, 2, 2, 1, 2, 0.5);
  st.cost.embedding_seconds_per_token = 0.25;
  const std::vector<int64_t> layers = {2, 4};
  const std::vector<double> tails = {3, 1};
  const StepBound b = step_lower_bound(std::vector<int64_t>{10}, st, layers, tails);
  EXPECT_DOUBLE_EQ(b.work, 486);         // stage 1 and its tail
  EXPECT_DOUBLE_EQ(b.longest, 730.5);    // ending on stage 0, with stage 0's tail
  EXPECT_DOUBLE_EQ(b.seconds(), 730.5);
  EXPECT_THROW(step_lower_bound(std::vector<int64_t>{10}, st, std::vector<int64_t>{6}), std::invalid_argument);
  EXPECT_THROW(step_lower_bound(std::vector<int64_t>{10}, st, layers, std::vector<double>{1}), std::invalid_argument);
  EXPECT_THROW(step_lower_bound(std::vector<int64_t>{-1}, st, layers), std::invalid_argument);
}

TEST(StepBound, MemoryForcesOffload) {
  // 400 tokens over 2 ranks of capacity 100 with 10 layers: a member holds 200 tokens,
  // which max_micro_batch_tokens admits from ratio 5/8 (10 x 100 / (2 + 3/8 x 8) = 200).
  EXPECT_EQ(max_micro_batch_tokens(100, 10, 0.625), 200);
  EXPECT_LT(max_micro_batch_tokens(100, 10, 0.62), 200);
  // 5/8 x 8 offloaded layers x 200 bytes = 1000 bytes out and back at 100 B/s: 20 s,
  // against 10 x 0.001 x 400 / 2 = 2 s of work.
  const PlannerSettings st = settings(2, 100, 10, 1, 0, 0.001);
  const std::vector<int64_t> layers = {10};
  StepBound b = step_lower_bound(std::vector<int64_t>{400}, st, layers);
  EXPECT_DOUBLE_EQ(b.work, 2);
  EXPECT_DOUBLE_EQ(b.longest, 2);
  EXPECT_NEAR(b.offload, 20, 1e-6);
  EXPECT_LE(b.offload, 20);
  // Without offload no plan places it; nothing is copied.
  PlannerSettings off = st;
  off.offload.enabled = false;
  EXPECT_DOUBLE_EQ(step_lower_bound(std::vector<int64_t>{400}, off, layers).offload, 0);
  // Two layers hold nothing back either (offload frees no memory there).
  PlannerSettings two = st;
  two.layers_per_stage = 2;
  EXPECT_DOUBLE_EQ(step_lower_bound(std::vector<int64_t>{400}, two, std::vector<int64_t>{2}).offload, 0);
}

TEST(StepBound, SlidingWindowCountsVisiblePairs) {
  // Window 2 over 4 tokens: P(4) = 3 + 2 x 2 = 7 visible pairs, attention_term 2 x 7 - 4 = 10.
  PlannerSettings st = settings(1, 10, 1, 1, 1, 0);
  st.cost.window = 2;
  const StepBound b = step_lower_bound(std::vector<int64_t>{4}, st, std::vector<int64_t>{1});
  EXPECT_DOUBLE_EQ(b.work, 10);
  EXPECT_DOUBLE_EQ(b.longest, 10);
}

}  // namespace
}  // namespace hdp
