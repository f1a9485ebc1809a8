// Step planners and the plan contract, without MPI: zig-zag chunks and the key rows
// a ring sends per step, token limits under offload, the cost model, choose_ranks,
// check_plan's rejections, a rank's share of a plan (rank_work), best-fit packing,
// and randomized invariants of plan_naive and plan_static on long-tailed lengths.

#include <gtest/gtest.h>

#include "planner_test_util.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "planning/cost_model.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"

namespace hdp {
namespace {

// Expects check_plan to throw std::invalid_argument whose message contains `needle`.
void expect_rejected(const StepPlan& plan, const std::vector<int64_t>& lengths, const std::string& needle,
                     int64_t layers = 1, int stages = 1) {
  try {
    check_plan(plan, lengths, layers, stages);
    ADD_FAILURE() << "check_plan accepted a plan it should reject (" << needle << ")";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A small cost model: one byte per token per layer, so Act(s)/Act(C) = s/C.
PlannerSettings settings(int hdp, int64_t capacity, int64_t layers) {
  PlannerSettings s;
  s.hdp = hdp;
  s.capacity = capacity;
  s.layers_per_stage = layers;
  s.cost.a2 = 1;
  s.cost.b1 = 1;
  s.cost.d2h_bytes_per_s = s.cost.h2d_bytes_per_s = 1e12;  // every copy hides
  return s;
}

TEST(Zigzag, ChunkBoundaries) {
  // 10 tokens, ring of 2: chunks [0,2) [2,5) [5,7) [7,10).
  const std::vector<int64_t> expected = {0, 2, 5, 7, 10};
  for (int c = 0; c <= 4; ++c) EXPECT_EQ(zigzag_chunk_begin(10, c, 2), expected[c]);
  // 7 tokens, ring of 3: 7c/6.
  const std::vector<int64_t> seven = {0, 1, 2, 3, 4, 5, 7};
  for (int c = 0; c <= 6; ++c) EXPECT_EQ(zigzag_chunk_begin(7, c, 3), seven[c]);
  // Ring of one: two halves.
  EXPECT_EQ(zigzag_chunk_begin(5, 1, 1), 2);
  EXPECT_EQ(zigzag_chunk_begin(5, 2, 1), 5);
  EXPECT_EQ(zigzag_chunk_begin(int64_t{1} << 40, 7, 4), (int64_t{1} << 40) / 8 * 7);
  EXPECT_THROW(zigzag_chunk_begin(10, 5, 2), std::invalid_argument);
  EXPECT_THROW(zigzag_chunk_begin(10, -1, 2), std::invalid_argument);
  EXPECT_THROW(zigzag_chunk_begin(10, 0, 0), std::invalid_argument);
  // All bounds at once (zigzag_chunk_bounds, by adding instead of dividing) equal
  // the chunk starts one by one, above 2^31 tokens too.
  std::mt19937_64 rng(31);
  std::vector<int64_t> bounds;
  for (int trial = 0; trial < 300; ++trial) {
    const int k = 1 + static_cast<int>(rng() % 800);
    const int64_t length = trial % 3 == 0 ? static_cast<int64_t>(rng() % (int64_t{1} << 42)) : static_cast<int64_t>(rng() % 5000);
    zigzag_chunk_bounds(length, k, bounds);
    ASSERT_EQ(bounds.size(), 2 * static_cast<size_t>(k) + 1);
    for (int c = 0; c <= 2 * k; ++c) ASSERT_EQ(bounds[c], zigzag_chunk_begin(length, c, k)) << length << " " << k << " " << c;
  }
  EXPECT_THROW(zigzag_chunk_bounds(10, 0, bounds), std::invalid_argument);
  // Members 0 and 1 of a 10-token ring of 2 hold 2 + 3 and 3 + 2 tokens.
  EXPECT_EQ(zigzag_max_member_tokens(10, 2), 5);
  // Rounding: 3191 tokens over 8 ranks leave one member 400 tokens, not ceil(3191 / 8) = 399.
  EXPECT_EQ(zigzag_max_member_tokens(3191, 8), 400);
}

TEST(Zigzag, ChunksTileTheSequence) {
  for (int64_t len : {1, 2, 3, 7, 100, 4097}) {
    for (int k = 1; k <= 9; ++k) {
      int64_t total = 0;
      for (int j = 0; j < k; ++j) {
        const int64_t a = zigzag_chunk_begin(len, j + 1, k) - zigzag_chunk_begin(len, j, k);
        const int64_t b = zigzag_chunk_begin(len, 2 * k - j, k) - zigzag_chunk_begin(len, 2 * k - 1 - j, k);
        EXPECT_GE(a, 0);
        EXPECT_GE(b, 0);
        total += a + b;
      }
      EXPECT_EQ(total, len);
    }
  }
}

TEST(RingStepRows, HandComputedRings) {
  // 10 tokens over 2 members: chunks [0,2) [2,5) [5,7) [7,10); member 0 holds chunks 0
  // and 3, member 1 chunks 1 and 2. Member 0 reads both of member 1's chunks (its
  // chunk 3 comes after them): 3 + 2 rows; member 1 reads chunk 0 (2 rows), not 3.
  RingStepRows r = ring_step_rows(std::vector<int64_t>{10}, 2, 0);
  EXPECT_EQ(r.most, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(r.total, 7);
  // Window 2: a key row is read only by queries less than 2 rows after it. Member 0's
  // queries start at 7: of chunk 1 none, of chunk 2 row 6. Member 1's chunk 1 starts
  // at 2: of chunk 0 row 1.
  r = ring_step_rows(std::vector<int64_t>{10}, 2, 2);
  EXPECT_EQ(r.most, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r.total, 2);
  // 3 tokens over 2 members: chunk 0 is empty, member 0 holds row 2 (chunk 3) and
  // reads rows 0 and 1 of member 1; member 1 reads nothing. With the 10-token
  // sequence beside it, member 0 reads 5 + 2.
  r = ring_step_rows(std::vector<int64_t>{3}, 2, 0);
  EXPECT_EQ(r.most, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(r.total, 2);
  r = ring_step_rows(std::vector<int64_t>{10, 3}, 2, 0);
  EXPECT_EQ(r.most, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(r.total, 9);
  // A ring of one reads nothing.
  r = ring_step_rows(std::vector<int64_t>{10}, 1, 0);
  EXPECT_EQ(r.most, (std::vector<int64_t>{0}));
  EXPECT_EQ(r.total, 0);
}

// ring_step_rows counts what key_rows_needed gives every member at every step, for
// rings with short sequences (empty chunks), long ones and windows that cut or not;
// every tenth ring with more than 64 sequences, most of them short (several words of
// ring_step_rows's bits).
TEST(RingStepRows, EqualsKeyRowsNeededMemberByMember) {
  std::mt19937_64 rng(7);
  std::vector<ChunkRows> runs;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 9)(rng);
    const bool many = trial % 10 == 9;
    std::vector<int64_t> lengths(std::uniform_int_distribution<int>(many ? 65 : 1, many ? 150 : 6)(rng));
    for (int64_t& len : lengths)
      len = std::uniform_int_distribution<int64_t>(1, many ? 2 * n + 2 : trial % 2 ? 60 : 3 * n)(rng);
    const int64_t window = trial % 3 == 0 ? 0 : std::uniform_int_distribution<int64_t>(1, 30)(rng);
    std::vector<int> peers(n);
    std::iota(peers.begin(), peers.end(), 0);
    const RingLayout layout = zigzag_ring_layout(peers, lengths, 0);
    RingStepRows expected;
    expected.most.assign(n, 0);
    for (int t = 1; t < n; ++t)
      for (int p = 0; p < n; ++p) {
        key_rows_needed(layout, (p - t + n) % n, p, window, runs);
        expected.most[t] = std::max(expected.most[t], total_rows(runs));
        expected.total += total_rows(runs);
      }
    const RingStepRows got = ring_step_rows(lengths, n, window);
    ASSERT_EQ(got.most, expected.most) << "trial " << trial << ", ring of " << n << ", window " << window;
    ASSERT_EQ(got.total, expected.total) << "trial " << trial;
  }
}

TEST(Limits, MaxMicroBatchTokens) {
  EXPECT_EQ(max_micro_batch_tokens(1000, 8, 0.0), 1000);
  EXPECT_EQ(max_micro_batch_tokens(1000, 8, 1.0), 4000);   // 8C / 2
  EXPECT_EQ(max_micro_batch_tokens(1000, 8, 0.5), 1600);   // 8C / (2 + 3)
  EXPECT_EQ(max_micro_batch_tokens(1000, 4, 0.5), 1333);   // floor(4C / 3)
  EXPECT_EQ(max_micro_batch_tokens(1000, 3, 1.0), 1500);   // 3C / 2
  EXPECT_EQ(max_micro_batch_tokens(4096, 32, 1.0), 65536);
  // Two or fewer layers: nothing to offload past the two held in full.
  EXPECT_EQ(max_micro_batch_tokens(1000, 2, 1.0), 1000);
  EXPECT_EQ(max_micro_batch_tokens(1000, 1, 0.7), 1000);
  EXPECT_THROW(max_micro_batch_tokens(1000, 8, -0.1), std::invalid_argument);
  EXPECT_THROW(max_micro_batch_tokens(1000, 8, 1.5), std::invalid_argument);
  EXPECT_THROW(max_micro_batch_tokens(1000, 0, 0.0), std::invalid_argument);
  EXPECT_THROW(max_micro_batch_tokens(0, 4, 0.0), std::invalid_argument);
}

TEST(CostModel, AnalyticMatchesFlopCount) {
  const CostModel m = analytic_cost_model(testing::kSmallLayer, 1, 400, 2e11, 1e10);
  const double qdim = 512, params = 512.0 * (512 + 2 * 256) + 512.0 * 512 + 3.0 * 512 * 1376;
  for (int64_t s : {1, 100, 4096}) {
    const double flops = 6 * params * s + 6 * qdim * s * (s + 1.0);
    EXPECT_NEAR(m.compute_seconds(s), flops / 2e11, 1e-12 * flops / 2e11);
    EXPECT_DOUBLE_EQ(m.activation_bytes(s), 400.0 * s);
  }
  EXPECT_DOUBLE_EQ(m.d2h_bytes_per_s, 1e10);
  EXPECT_DOUBLE_EQ(m.h2d_bytes_per_s, 1e10);
  EXPECT_THROW(analytic_cost_model(testing::kSmallLayer, 1, 400, 0, 1e10), std::invalid_argument);
}

// Mistral's sliding window (W = 1024): attention FLOPs follow the visible pairs,
// s (s + 1) / 2 up to W and W (W + 1) / 2 + (s - W) W past it, so the layer's time
// grows linearly past the window (12 qdim FLOPs per pair, 6 per matmul parameter
// and token), and the planner's per-sequence price is the MFU's FLOP count.
TEST(CostModel, SlidingWindowCountsVisiblePairsOnly) {
  ModelShape shape = testing::kSmallLayer;
  shape.window = 1024;
  const CostModel m = analytic_cost_model(shape, 1, 400, 2e11, 1e10);
  EXPECT_EQ(m.window, 1024);
  const double qdim = 512, params = 512.0 * (512 + 2 * 256) + 512.0 * 512 + 3.0 * 512 * 1376;
  const std::vector<std::pair<int64_t, double>> pairs = {
      {1, 1}, {100, 5050}, {1024, 524800}, {1025, 524800 + 1024}, {4096, 524800 + 3072.0 * 1024}};
  for (const auto& [s, p] : pairs) {
    const double flops = 6 * params * s + 12 * qdim * p;
    EXPECT_NEAR(m.compute_seconds(s), flops / 2e11, 1e-12 * flops / 2e11) << s;
  }
  // Linear past the window: equal steps in s cost equal time.
  const double step1 = m.compute_seconds(3000) - m.compute_seconds(2000);
  const double step2 = m.compute_seconds(4000) - m.compute_seconds(3000);
  EXPECT_NEAR(step1, step2, 1e-9 * step1);
  EXPECT_NEAR(step1, 1000 * (6 * params + 12 * qdim * 1024) / 2e11, 1e-9 * step1);
  // Within the window it is the model without one.
  const CostModel full = analytic_cost_model(testing::kSmallLayer, 1, 400, 2e11, 1e10);
  EXPECT_EQ(m.compute_seconds(1024), full.compute_seconds(1024));
  // At 4096 tokens attention is 3670528 / 8390656 of full attention's.
  const double linear = 6 * params * 4096 / 2e11;
  EXPECT_NEAR((m.compute_seconds(4096) - linear) / (full.compute_seconds(4096) - linear), 3670528.0 / 8390656.0,
              1e-9);
  // The one FLOP definition: the MFU's count of a one-layer model is the same.
  shape.layers = 1;
  shape.vocab = 1;
  for (int64_t s : {500, 4096}) {
    const std::vector<int64_t> one = {s};
    const double mfu_flops = training_flops(shape, one) - head_flops_per_token(shape, 1) * static_cast<double>(s);
    EXPECT_NEAR(m.compute_seconds(s) * 2e11, mfu_flops, 1e-9 * mfu_flops) << s;
  }
}

TEST(ChooseRanks, WithoutOffloadTheRanksCoverTheTokens) {
  PlannerSettings s = settings(16, 1000, 8);
  s.offload.enabled = false;
  EXPECT_EQ(choose_ranks(1000, s).ranks, 1);
  EXPECT_EQ(choose_ranks(1001, s).ranks, 2);
  EXPECT_EQ(choose_ranks(2500, s).ranks, 3);
  EXPECT_EQ(choose_ranks(4000, s).ranks, 4);
  EXPECT_EQ(choose_ranks(8000, s).ranks, 8);
  EXPECT_EQ(choose_ranks(8000, s).ratio, 0.0);
  // Odd capacity: 8 ranks would leave a member 400 > 399 tokens.
  PlannerSettings odd = settings(16, 399, 8);
  odd.offload.enabled = false;
  EXPECT_EQ(choose_ranks(3191, odd).ranks, 9);
}

TEST(ChooseRanks, FullOffloadNeedsAboutAQuarterOfTheRanks) {
  PlannerSettings s = settings(16, 1000, 8);
  s.offload.forced_ratio = 1.0;
  // 8 layers, r = 1: two layers resident instead of eight.
  EXPECT_EQ(choose_ranks(8000, s).ranks, 2);
  EXPECT_EQ(choose_ranks(8000, s).ratio, 1.0);
  EXPECT_EQ(choose_ranks(16000, s).ranks, 4);
  EXPECT_EQ(choose_ranks(4000, s).ranks, 1);  // one rank holds 4C tokens
  // The cost model picks r = 1 too when copies are free, and no lower.
  s.offload.forced_ratio = -1;
  EXPECT_EQ(choose_ranks(16000, s).ranks, 4);
  EXPECT_NEAR(choose_ranks(16000, s).ratio, 1.0, 1e-9);
}

TEST(ChooseRanks, HostMemoryLimitsTheOffload) {
  PlannerSettings s = settings(16, 1000, 8);
  s.offload.forced_ratio = 1.0;
  // Unlimited: 4 ranks of 4000 tokens, 6 layers parking 4000 bytes each = 24000 bytes.
  EXPECT_EQ(choose_ranks(16000, s).ranks, 4);
  // With 12000 bytes per rank: D ranks need ratio r >= (16 - D) / 12 and park
  // 6 r 16000 / D bytes: D = 5 -> 17600, 6 -> 13333, 7 -> 10286 (r = 0.75).
  s.offload.host_bytes_per_rank = 12000;
  const LongSequenceChoice c = choose_ranks(16000, s);
  EXPECT_EQ(c.ranks, 7);
  EXPECT_NEAR(c.ratio, 0.75, 1e-3);
  EXPECT_LE(6.0 * c.ratio * static_cast<double>(zigzag_max_member_tokens(16000, c.ranks)), 12000.0);
  // A pipeline stage keeps micro-batches of every stage in flight: twice the host memory.
  s.pipeline_stages = 2;
  EXPECT_GT(choose_ranks(16000, s).ranks, 7);
}

TEST(ChooseRanks, HidingConditionLimitsTheRatio) {
  PlannerSettings s = settings(16, 1000, 8);
  // T(s) = 0.5 s, Act(s) = s, bandwidth 1: copies hide for r <= 0.5.
  s.cost.a1 = 0;
  s.cost.b1 = 0.5;
  s.cost.d2h_bytes_per_s = 1;
  s.cost.h2d_bytes_per_s = 3;
  LongSequenceChoice c = choose_ranks(8000, s);
  // r = 0.5: (2 + 3) * 8000 / 8000 = 5 ranks (8 without offload, 2 at r = 1).
  EXPECT_EQ(c.ranks, 5);
  EXPECT_NEAR(c.ratio, 0.5, 1e-9);
  EXPECT_LE(c.ratio, 0.5 + 1e-12);
  // 7000 tokens need 5 ranks from r = 1 - (40/7 - 2)/6 = 0.381: lowered to that.
  c = choose_ranks(7000, s);
  EXPECT_EQ(c.ranks, 5);
  EXPECT_NEAR(c.ratio, 1.0 - (40.0 / 7.0 - 2.0) / 6.0, 1e-6);
  EXPECT_LE(zigzag_max_member_tokens(7000, 5), max_micro_batch_tokens(1000, 8, c.ratio));
  // No copy bandwidth: no offload.
  s.cost.d2h_bytes_per_s = 0;
  EXPECT_EQ(choose_ranks(8000, s).ratio, 0.0);
  EXPECT_EQ(choose_ranks(8000, s).ranks, 8);
}

TEST(ChooseRanks, TwoLayersCannotOffloadAndTooLongThrows) {
  PlannerSettings s = settings(4, 1000, 2);
  s.offload.forced_ratio = 1.0;
  EXPECT_EQ(choose_ranks(3500, s).ratio, 0.0);
  EXPECT_EQ(choose_ranks(3500, s).ranks, 4);
  try {
    choose_ranks(4001, s);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("4001 tokens needs 5 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hdp is 4"), std::string::npos) << e.what();
  }
  // The memory model binds where it is stricter than the token count: with
  // Act(s) = s - 500, Act(1900) / Act(1000) = 2.8 needs 3 ranks where tokens need 2.
  PlannerSettings b = settings(16, 1000, 8);
  b.offload.enabled = false;
  b.cost.b2 = -500;
  EXPECT_EQ(choose_ranks(1900, b).ranks, 3);
  EXPECT_EQ(choose_ranks(1000, b).ranks, 1);
}

// Recomputation as offload's alternative (PlannerSettings::recompute): 10 layers of
// 1,000 tokens, a recomputed layer keeping a quarter of a layer's bytes.
PlannerSettings mixing(int hdp, double rerun_per_token) {
  PlannerSettings s = settings(hdp, 1000, 10);
  s.cost.b1 = 1e-3;
  s.recompute.max_layers = 10;
  s.recompute.recomputed.a2 = 0.25;
  s.recompute.recomputed.rb = s.recompute.recomputed.rb_ring = rerun_per_token;
  return s;
}

TEST(ChooseRanks, RecomputationJoinsOffloadWhereHostMemoryBinds) {
  // 16,000 tokens on 4 ranks: 4,000 each, 10,000 / 4,000 = 2.5 whole layers. Offload
  // alone parks 8 x 0.9375 x 4,000 = 30,000 bytes; with 28,000 per rank it does not
  // fit (3 ranks hold at most 5,000 tokens each: fewer cannot).
  PlannerSettings s = mixing(4, 1e-4);
  s.offload.host_bytes_per_rank = 28000;
  PlannerSettings alone = s;
  alone.recompute.max_layers = 0;
  EXPECT_THROW(choose_ranks(16000, alone), std::invalid_argument);
  // One recomputed layer: 0.25 + 2 + 7 (1 - r) <= 2.5, r = 1 - 0.25 / 7, 27,000 bytes,
  // at R = 1e-4 x 4,000 = 0.4 s; ten (2.5 layers, no offload) would cost 4 s.
  const LongSequenceChoice c = choose_ranks(16000, s);
  EXPECT_EQ(c.ranks, 4);
  EXPECT_EQ(c.recompute_layers, 1);
  EXPECT_NEAR(c.ratio, 1 - 0.25 / 7, 1e-9);
  // Unbounded host memory: offload alone, r = 1 - 0.5 / 8.
  s.offload.host_bytes_per_rank = 0;
  const LongSequenceChoice free = choose_ranks(16000, s);
  EXPECT_EQ(free.recompute_layers, 0);
  EXPECT_NEAR(free.ratio, 0.9375, 1e-9);
  // The plans carry it, pass check_plan, and the predicted time counts the rerun:
  // 10 layers x 1e-3 x 16,000 / 4 + 0.4 s on every member.
  s.offload.host_bytes_per_rank = 28000;
  const std::vector<int64_t> lengths = {16000};
  for (const StepPlan& plan : {plan_naive(lengths, s), plan_balance(lengths, s, BalanceSettings{})}) {
    EXPECT_DOUBLE_EQ(plan.recomputed_layer_share, 0.25);
    check_plan(plan, lengths, 10, 1);
    for (const auto& rank : plan.ranks) {
      ASSERT_EQ(rank.size(), 1u);
      EXPECT_EQ(rank[0].recompute_layers, 1);
    }
    for (double seconds : predicted_rank_seconds(plan, lengths, s)) EXPECT_NEAR(seconds, 40.4, 1e-9);
    // Were its recomputed layer to keep all it saves, a member would hold more than
    // its limit: 10,000 / (1 + 2 + 7 x 0.25 / 7) = 3,076 tokens.
    StepPlan whole = plan;
    whole.recomputed_layer_share = 1;
    expect_rejected(whole, lengths, "its limit is 3076", 10);
  }
}

TEST(ChooseRanks, FreeRecomputationNeedsFewerRanksThanExposedCopies) {
  // Copies at 1 byte/s hide under nothing, so offload alone keeps 8 ranks for 8,000
  // tokens. A rerun that costs nothing (selective's, as the FLOP counts see it) at
  // 0.6 of a layer: 5 ranks of 1,600 tokens hold 10 x 0.6 = 6 <= 6.25 whole layers
  // with every layer recomputed; 4 ranks of 2,000 would need offload (5 < 6).
  PlannerSettings s = mixing(16, 0);
  s.recompute.recomputed.a2 = 0.6;
  s.cost.d2h_bytes_per_s = s.cost.h2d_bytes_per_s = 1;
  PlannerSettings alone = s;
  alone.recompute.max_layers = 0;
  EXPECT_EQ(choose_ranks(8000, alone).ranks, 8);
  const LongSequenceChoice c = choose_ranks(8000, s);
  EXPECT_EQ(c.ranks, 5);
  EXPECT_EQ(c.recompute_layers, 10);
  EXPECT_EQ(c.ratio, 0);
}

using testing::hand_plan;
using testing::kHandLengths;

TEST(CheckPlan, AcceptsAValidPlanAndEmptyMicroBatches) {
  StepPlan p = hand_plan();
  EXPECT_NO_THROW(check_plan(p, kHandLengths, 1, 1));
  EXPECT_NO_THROW(check_plan(p, kHandLengths, 4, 2));
  p.ranks[1].insert(p.ranks[1].begin(), PlannedMicroBatch{});
  p.ranks[0].push_back(PlannedMicroBatch{});
  EXPECT_NO_THROW(check_plan(p, kHandLengths, 1, 1));
}

TEST(CheckPlan, RejectsMissingAndDoubleTokens) {
  StepPlan p = hand_plan();
  p.ranks[1][0].pieces[0].length = 2;
  expect_rejected(p, kHandLengths, "sequence 2 tokens from 2 are missing");
  p = hand_plan();
  PlannedMicroBatch extra;
  extra.pieces = {{1, 3, 1, -1}};
  p.ranks[1].push_back(extra);
  expect_rejected(p, kHandLengths, "sequence 1 tokens from 3 are assigned twice");
  p = hand_plan();
  p.ranks[0][0].pieces[0].length = 5;
  expect_rejected(p, kHandLengths, "covers tokens [0, 5) of sequence 1");
  p = hand_plan();
  p.ranks[0][0].pieces[0].sequence = 3;
  expect_rejected(p, kHandLengths, "names sequence 3");
}

TEST(CheckPlan, RejectsOverCapacityAndBadRatios) {
  StepPlan p = hand_plan();
  p.capacity = 8;
  expect_rejected(p, kHandLengths, "rank 0 micro-batch 0 holds 9 tokens, its limit is 8");
  // Offload raises the limit: 8 layers at r = 1 allow 4 C.
  for (auto& rank : p.ranks) rank[0].offload_ratio = 1.0;
  EXPECT_NO_THROW(check_plan(p, kHandLengths, 8, 1));
  expect_rejected(p, kHandLengths, "its limit is 8", 2, 1);
  p.ranks[1][0].offload_ratio = 1.5;
  expect_rejected(p, kHandLengths, "rank 1 micro-batch 0 has offload ratio", 8, 1);
}

TEST(CheckPlan, RejectsWrongChunksAndRowOrder) {
  StepPlan p = hand_plan();
  // Boundaries moved by one token: coverage intact, chunks wrong.
  p.ranks[0][0].pieces[1].length = 3;
  p.ranks[1][0].pieces[1] = {0, 3, 2, 0};
  expect_rejected(p, kHandLengths, "rank 0 micro-batch 0 ring piece 0 is (sequence 0, offset 0, length 3");
  p = hand_plan();
  std::swap(p.ranks[1][0].pieces[1], p.ranks[1][0].pieces[2]);
  expect_rejected(p, kHandLengths, "rank 1 micro-batch 0 ring piece 0 is (sequence 0, offset 5");
  p = hand_plan();
  std::rotate(p.ranks[0][0].pieces.begin(), p.ranks[0][0].pieces.begin() + 1, p.ranks[0][0].pieces.end());
  expect_rejected(p, kHandLengths, "is local but follows ring pieces");
  // Chunks of another position.
  p = hand_plan();
  p.rings[0].ranks = {1, 0};
  expect_rejected(p, kHandLengths, "position 1 of ring 0");
}

TEST(CheckPlan, RejectsBadRingReferences) {
  StepPlan p = hand_plan();
  p.ranks[1][0].ring = -1;
  expect_rejected(p, kHandLengths, "names ring 0 but the micro-batch takes part in no ring");
  p = hand_plan();
  p.rings[0].ranks = {1};
  expect_rejected(p, kHandLengths, "rank 0 micro-batch 0 takes part in ring 0, which rank 0 is not a member of");
  p = hand_plan();
  p.rings[0].ranks = {0, 0};
  expect_rejected(p, kHandLengths, "ring 0 names rank 0 twice");
  p = hand_plan();
  p.rings[0].ranks = {0, 2};
  expect_rejected(p, kHandLengths, "ring 0 names rank 2, hdp is 2");
  p = hand_plan();
  p.rings.push_back(Ring{{0, 1}, {1}});
  expect_rejected(p, kHandLengths, "has no micro-batch in ring 1");
  p = hand_plan();
  p.ranks[0].push_back(p.ranks[0][0]);
  expect_rejected(p, kHandLengths, "rank 0 takes part in ring 0 in micro-batches 0 and 1");
  p = hand_plan();
  p.ranks[0][0].pieces[1].ring = 1;
  expect_rejected(p, kHandLengths, "names ring 1 but the micro-batch takes part in ring 0");
}

// Two rings over ranks {0, 1}: sequence 0 (ring 0) and sequence 1 (ring 1), 4 tokens each.
StepPlan two_ring_plan(std::vector<int> order0, std::vector<int> order1) {
  StepPlan p;
  p.capacity = 10;
  p.rings = {Ring{{0, 1}, {0}}, Ring{{0, 1}, {1}}};
  p.ranks.resize(2);
  const std::vector<int64_t> lengths = {4, 4};
  for (int r = 0; r < 2; ++r) {
    for (int ring : r == 0 ? order0 : order1) {
      PlannedMicroBatch mb;
      if (ring < 0) {
        mb.pieces = {{2, 0, 2, -1}};
      } else {
        mb.ring = ring;
        mb.pieces = {{ring, r, 1, ring}, {ring, 3 - r, 1, ring}};
      }
      p.ranks[r].push_back(mb);
    }
  }
  return p;
}

TEST(CheckPlan, RejectsRingsMetInDifferentOrders) {
  const std::vector<int64_t> lengths = {4, 4, 2};
  EXPECT_NO_THROW(check_plan(two_ring_plan({0, 1, -1}, {0, 1}), lengths, 1, 1));
  expect_rejected(two_ring_plan({0, 1, -1}, {1, 0}), lengths, "ranks 0 and 1 meet their shared rings in different orders");
}

TEST(CheckPlan, RejectsACycleOfPairwiseConsistentRings) {
  // Rings 0 = {0, 1}, 1 = {1, 2}, 2 = {2, 0}: every pair shares one ring, but rank 0
  // waits in ring 0 for rank 1, which waits in ring 1 for rank 2, which waits in ring 2.
  StepPlan p;
  p.capacity = 10;
  p.rings = {Ring{{0, 1}, {0}}, Ring{{1, 2}, {1}}, Ring{{2, 0}, {2}}};
  p.ranks.resize(3);
  const std::vector<int64_t> lengths = {4, 4, 4};
  auto mb = [&](int ring, int rank) {
    const int pos = p.rings[ring].ranks[0] == rank ? 0 : 1;
    PlannedMicroBatch m;
    m.ring = ring;
    m.pieces = {{ring, pos, 1, ring}, {ring, 3 - pos, 1, ring}};
    return m;
  };
  p.ranks[0] = {mb(0, 0), mb(2, 0)};
  p.ranks[1] = {mb(1, 1), mb(0, 1)};
  p.ranks[2] = {mb(2, 2), mb(1, 2)};
  expect_rejected(p, lengths, "the step deadlocks");
  p.ranks[0] = {mb(2, 0), mb(0, 0)};
  EXPECT_NO_THROW(check_plan(p, lengths, 1, 1));
}

TEST(CheckPlan, RejectsRingsThatMissEachOtherInOneFOneB) {
  const std::vector<int64_t> lengths = {4, 4, 2};
  // Rank 0: ring 0, ring 1. Rank 1: ring 0, a local micro-batch, ring 1. One stage: fine.
  const StepPlan p = two_ring_plan({0, 1}, {0, -1, 1});
  EXPECT_NO_THROW(check_plan(p, lengths, 1, 1));
  // Two stages, stage 0: rank 0 runs F0 F1 B0 B1, rank 1 runs F0 F1 B0 F2 B1 B2:
  // forward of ring 1 before backward of ring 0 on rank 0, after it on rank 1.
  expect_rejected(p, lengths, "stage 0: ranks 0 and 1 meet their shared rings in different 1F1B orders", 1, 2);
  // Padding rank 0 to three micro-batches with an empty one aligns the schedules.
  StepPlan padded = two_ring_plan({0, 1}, {0, -1, 1});
  padded.ranks[0].insert(padded.ranks[0].begin() + 1, PlannedMicroBatch{});
  EXPECT_NO_THROW(check_plan(padded, lengths, 1, 2));
  EXPECT_NO_THROW(check_plan(padded, lengths, 1, 3));
}

// ---- planners ----

// Ranks holding pieces of each sequence.
std::vector<std::set<int>> ranks_per_sequence(const StepPlan& plan, size_t sequences) {
  std::vector<std::set<int>> out(sequences);
  for (size_t r = 0; r < plan.ranks.size(); ++r)
    for (const PlannedMicroBatch& mb : plan.ranks[r])
      for (const PlannedPiece& p : mb.pieces) out[p.sequence].insert(static_cast<int>(r));
  return out;
}

TEST(RankWork, EachRankGetsItsMicroBatchesAndItsViewOfTheirRings) {
  StepPlan p = hand_plan();
  PlannedMicroBatch local;
  local.pieces = {{1, 0, 4, -1}};
  p.ranks[1].push_back(local);  // a second micro-batch, outside the ring
  for (int rank : {0, 1}) {
    const std::vector<RankMicroBatch> work = rank_work(p, kHandLengths, rank);
    ASSERT_EQ(work.size(), p.ranks[rank].size());
    // The ring (sequence 0, 10 tokens, over ranks 0 and 1): chunks [0, 2) [2, 5) [5, 7) [7, 10);
    // member 0 holds chunks 0 and 3, member 1 chunks 1 and 2.
    const RingLayout& ring = work[0].ring_layout;
    EXPECT_EQ(work[0].planned.pieces.size(), p.ranks[rank][0].pieces.size());
    EXPECT_EQ(ring.peers, (std::vector<int>{0, 1}));
    EXPECT_EQ(ring.self, rank);
    ASSERT_EQ(ring.chunks.size(), 2u);
    ASSERT_EQ(ring.chunks[0].size(), 2u);
    EXPECT_EQ(ring.chunks[0][0].position, 0);
    EXPECT_EQ(ring.chunks[0][0].rows, 2);
    EXPECT_EQ(ring.chunks[0][1].position, 7);
    EXPECT_EQ(ring.chunks[0][1].rows, 3);
    ASSERT_EQ(ring.chunks[1].size(), 2u);
    EXPECT_EQ(ring.chunks[1][0].position, 2);
    EXPECT_EQ(ring.chunks[1][1].position, 5);
    EXPECT_EQ(ring.rows(0) + ring.rows(1), 10);
  }
  const std::vector<RankMicroBatch> second = rank_work(p, kHandLengths, 1);
  EXPECT_EQ(second[1].planned.ring, -1);
  EXPECT_TRUE(second[1].ring_layout.peers.empty());
  EXPECT_THROW(rank_work(p, kHandLengths, 2), std::invalid_argument);
  p.rings[0].ranks = {0, 2};  // rank 1's micro-batch names a ring without it
  EXPECT_THROW(rank_work(p, kHandLengths, 1), std::invalid_argument);
}

// A plan that runs forwards ahead of 1F1B never reaches a training rank: the trainer's
// executor would run it as 1F1B, so rank_work refuses it rather than drop the limits.
TEST(RankWork, RefusesAPlanRunningForwardsAheadOf1F1B) {
  StepPlan p = hand_plan();
  p.forward_limits = {{1}, {0}};
  try {
    rank_work(p, kHandLengths, 0);
    ADD_FAILURE() << "a plan with forward limits reached a rank";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ahead of 1F1B (StepPlan::forward_limits), which only the step simulator "
                                         "runs; the trainer's executor runs 1F1B"),
              std::string::npos)
        << e.what();
  }
}

TEST(BestFitDecreasing, Placement) {
  std::vector<int64_t> lengths = {5, 3, 7, 2, 4, 1};
  auto bins = best_fit_decreasing(lengths, 10);
  ASSERT_EQ(bins.size(), 3u);
  EXPECT_EQ(bins[0], (std::vector<size_t>{2, 1}));     // 7 + 3
  EXPECT_EQ(bins[1], (std::vector<size_t>{0, 4, 5}));  // 5 + 4 + 1 (1 goes to the tightest fit)
  EXPECT_EQ(bins[2], (std::vector<size_t>{3}));        // 2
  // Ties in length keep input order.
  std::vector<int64_t> ties = {4, 4, 4};
  auto tb = best_fit_decreasing(ties, 8);
  EXPECT_EQ(tb[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(tb[1], (std::vector<size_t>{2}));
  std::vector<int64_t> too_long = {11};
  EXPECT_THROW(best_fit_decreasing(too_long, 10), std::invalid_argument);
}

TEST(PlanNaive, ShortSequencesStayWholeAndLongOnesGetRings) {
  PlannerSettings s = settings(4, 1000, 8);
  s.offload.enabled = false;
  const std::vector<int64_t> lengths = {2500, 600, 400, 300, 900, 100};
  const StepPlan p = plan_naive(lengths, s);
  ASSERT_NO_THROW(check_plan(p, lengths, 8, 1));
  ASSERT_EQ(p.rings.size(), 1u);
  EXPECT_EQ(p.rings[0].ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.rings[0].sequences, (std::vector<int64_t>{0}));
  const auto holders = ranks_per_sequence(p, lengths.size());
  for (size_t q = 1; q < lengths.size(); ++q) EXPECT_EQ(holders[q].size(), 1u);
  // The largest packed micro-batch (900 + 100) goes to the idle rank 3 in slot 0.
  ASSERT_FALSE(p.ranks[3].empty());
  EXPECT_EQ(p.ranks[3][0].tokens(), 1000);
}

TEST(PlanNaive, PipelinesPadRingMembersToOneSchedule) {
  PlannerSettings s = settings(4, 1000, 8);
  s.offload.enabled = false;
  s.pipeline_stages = 2;
  const std::vector<int64_t> lengths = {2500, 1800, 1500, 900, 800, 700, 600, 500, 400, 300, 200};
  const StepPlan p = plan_naive(lengths, s);
  ASSERT_NO_THROW(check_plan(p, lengths, 8, 2));
  ASSERT_EQ(p.rings.size(), 3u);
  // Rings {0,1,2} then {0,1} and {2,3} in slot 1: all four ranks connected.
  for (int r = 1; r < 4; ++r) EXPECT_EQ(p.ranks[r].size(), p.ranks[0].size());
  for (const Ring& ring : p.rings) {
    int slot = -1;
    for (int rank : ring.ranks) {
      for (size_t m = 0; m < p.ranks[rank].size(); ++m) {
        if (p.ranks[rank][m].ring != &ring - p.rings.data()) continue;
        if (slot < 0) slot = static_cast<int>(m);
        EXPECT_EQ(static_cast<int>(m), slot);
      }
    }
  }
}

TEST(PlanNaive, OffloadLetsOneRankHoldALongSequence) {
  PlannerSettings s = settings(2, 1000, 8);
  s.offload.forced_ratio = 1.0;
  const std::vector<int64_t> lengths = {3500, 500};
  const StepPlan p = plan_naive(lengths, s);
  ASSERT_NO_THROW(check_plan(p, lengths, 8, 1));
  EXPECT_TRUE(p.rings.empty());
  EXPECT_EQ(p.ranks[0].size(), 1u);
  EXPECT_EQ(p.ranks[0][0].tokens(), 3500);
  EXPECT_EQ(p.ranks[0][0].offload_ratio, 1.0);
  EXPECT_EQ(p.ranks[1][0].offload_ratio, 0.0);
  s.offload.enabled = false;
  EXPECT_THROW(plan_naive(std::vector<int64_t>{3500}, s), std::invalid_argument);
}

TEST(PlanStatic, SplitsEveryRowOverItsGroup) {
  PlannerSettings s = settings(4, 1000, 4);
  const std::vector<int64_t> lengths = {1900, 300, 200, 700, 100};
  const StepPlan p = plan_static(lengths, s, 0);  // cp = 2
  ASSERT_NO_THROW(check_plan(p, lengths, 4, 1));
  ASSERT_NO_THROW(check_plan(p, lengths, 4, 2));
  ASSERT_FALSE(p.rings.empty());
  for (const Ring& ring : p.rings) EXPECT_EQ(ring.ranks.size(), 2u);
  for (size_t q = 0; q < lengths.size(); ++q) EXPECT_EQ(ranks_per_sequence(p, lengths.size())[q].size(), 2u);
  EXPECT_EQ(p.ranks[0].size(), p.ranks[1].size());
  EXPECT_EQ(p.ranks[2].size(), p.ranks[3].size());
  EXPECT_THROW(plan_static(lengths, s, 3), std::invalid_argument);
  EXPECT_THROW(plan_static(lengths, s, 1), std::invalid_argument);  // 1900 > C
  const StepPlan dp = plan_static(std::vector<int64_t>{500, 400, 300}, s, 1);
  EXPECT_TRUE(dp.rings.empty());
  EXPECT_NO_THROW(check_plan(dp, std::vector<int64_t>{500, 400, 300}, 4, 1));
}

TEST(PlanStatic, CountsMemberTokensExactly) {
  // Capacity 399 on 8 ranks: 3191 tokens would leave a member 400 tokens.
  PlannerSettings s = settings(8, 399, 4);
  EXPECT_THROW(plan_static(std::vector<int64_t>{3191}, s, 8), std::invalid_argument);
  // 3185 tokens leave member 0 with 399, and 7 more tokens give it one more: the
  // row has room for 7 tokens in total, but the 7 go to a row of their own.
  const std::vector<int64_t> lengths = {3185, 7};
  const StepPlan p = plan_static(lengths, s, 8);
  EXPECT_NO_THROW(check_plan(p, lengths, 4, 1));
  EXPECT_EQ(p.rings.size(), 2u);
  EXPECT_EQ(p.ranks[0].size(), 2u);
}

// ---- randomized invariants ----

// Long-tailed lengths: lognormal around C / 4, a few up to 8 C, each shortened
// until `fits` accepts it.
template <typename Fits>
std::vector<int64_t> long_tailed(std::mt19937_64& rng, int64_t capacity, int hdp, Fits fits) {
  std::lognormal_distribution<double> lognormal(std::log(capacity / 4.0), 1.2);
  const int64_t target = capacity * hdp * 3;
  std::vector<int64_t> lengths;
  int64_t total = 0;
  while (total < target) {
    int64_t len = std::clamp<int64_t>(static_cast<int64_t>(lognormal(rng)), 1, 8 * capacity);
    if (rng() % 10 == 0) len = 1 + static_cast<int64_t>(rng() % (8 * capacity));
    while (len > 1 && !fits(len)) len /= 2;
    lengths.push_back(len);
    total += len;
  }
  return lengths;
}

void expect_tokens_once_and_within_limits(const StepPlan& p, const std::vector<int64_t>& lengths, int64_t layers) {
  std::vector<int64_t> seen(lengths.size(), 0);
  for (const auto& rank : p.ranks) {
    for (const PlannedMicroBatch& mb : rank) {
      EXPECT_LE(mb.tokens(), max_micro_batch_tokens(p.capacity, layers, mb.offload_ratio));
      for (const PlannedPiece& piece : mb.pieces) seen[piece.sequence] += piece.length;
    }
  }
  EXPECT_EQ(seen, lengths);
}

// Every rank's ring layouts (rank_work) name, as its own chunks, exactly the ring
// rows its micro-batches hold, in row order.
void expect_ring_layouts_match_rows(const StepPlan& p, const std::vector<int64_t>& lengths) {
  for (int rank = 0; rank < static_cast<int>(p.ranks.size()); ++rank) {
    const std::vector<RankMicroBatch> work = rank_work(p, lengths, rank);
    ASSERT_EQ(work.size(), p.ranks[rank].size());
    for (const RankMicroBatch& mb : work) {
      std::vector<std::tuple<int64_t, int64_t, int64_t>> rows, chunks;  // (sequence, position, length)
      for (const PlannedPiece& piece : mb.planned.pieces)
        if (piece.ring >= 0) rows.emplace_back(piece.sequence, piece.offset, piece.length);
      if (mb.planned.ring < 0) {
        EXPECT_TRUE(rows.empty());
        EXPECT_TRUE(mb.ring_layout.peers.empty());
        continue;
      }
      const RingLayout& ring = mb.ring_layout;
      ASSERT_EQ(ring.peers, p.rings[mb.planned.ring].ranks);
      EXPECT_EQ(ring.peers[ring.self], rank);
      for (const RingChunk& c : ring.chunks[ring.self])
        chunks.emplace_back(p.rings[mb.planned.ring].sequences[c.sequence], c.position, c.rows);
      EXPECT_EQ(chunks, rows) << "rank " << rank;
    }
  }
}

TEST(Randomized, PlansKeepTheirInvariants) {
  std::mt19937_64 rng(20240611);
  const std::vector<int> hdps = {1, 2, 3, 4, 5, 8};
  int rings_seen = 0, offloaded = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int hdp = hdps[trial % hdps.size()];
    const int64_t capacity = 512 + static_cast<int64_t>(rng() % 3585);
    const int64_t layers = 1 + static_cast<int64_t>(rng() % 8);
    const int stages = 1 + static_cast<int>(rng() % 2);
    PlannerSettings s;
    s.hdp = hdp;
    s.capacity = capacity;
    s.layers_per_stage = layers;
    s.pipeline_stages = stages;
    // A small LLaMA layer; copy bandwidth from starved to plenty.
    s.cost = analytic_cost_model(testing::kSmallLayer, 1, 4.0 * 16 * 512, 2e11,
                                 std::pow(10.0, 8 + static_cast<double>(rng() % 5)));
    switch (rng() % 4) {
      case 0: s.offload.enabled = false; break;
      case 1: s.offload.forced_ratio = static_cast<double>(rng() % 11) / 10; break;
      default: break;
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + ": hdp " + std::to_string(hdp) + ", capacity " +
                 std::to_string(capacity) + ", layers " + std::to_string(layers) + ", stages " +
                 std::to_string(stages));

    const std::vector<int64_t> lengths = long_tailed(rng, capacity, hdp, [&](int64_t len) {
      try {
        choose_ranks(len, s);
        return true;
      } catch (const std::invalid_argument&) {
        return false;
      }
    });
    const StepPlan naive = plan_naive(lengths, s);
    ASSERT_NO_THROW(check_plan(naive, lengths, layers, stages));
    expect_tokens_once_and_within_limits(naive, lengths, layers);
    expect_ring_layouts_match_rows(naive, lengths);
    const auto holders = ranks_per_sequence(naive, lengths.size());
    for (size_t q = 0; q < lengths.size(); ++q) {
      const int most = lengths[q] <= capacity ? 1 : choose_ranks(lengths[q], s).ranks;
      EXPECT_LE(static_cast<int>(holders[q].size()), most) << "sequence " << q << " of " << lengths[q];
    }
    rings_seen += !naive.rings.empty();
    for (const auto& rank : naive.ranks)
      for (const PlannedMicroBatch& mb : rank) offloaded += mb.offload_ratio > 0;

    const std::vector<int64_t> static_lengths = long_tailed(
        rng, capacity, hdp, [&](int64_t len) { return zigzag_max_member_tokens(len, hdp) <= capacity; });
    const StepPlan fixed = plan_static(static_lengths, s, 0);
    ASSERT_NO_THROW(check_plan(fixed, static_lengths, layers, stages));
    expect_tokens_once_and_within_limits(fixed, static_lengths, layers);
    expect_ring_layouts_match_rows(fixed, static_lengths);

    // Only short sequences: no attention traffic under HDP, rings under static cp > 1.
    std::vector<int64_t> short_lengths;
    for (int64_t len : lengths) short_lengths.push_back(std::min(len, capacity));
    const StepPlan short_naive = plan_naive(short_lengths, s);
    ASSERT_NO_THROW(check_plan(short_naive, short_lengths, layers, stages));
    EXPECT_TRUE(short_naive.rings.empty());
    if (hdp % 2 == 0) {
      const StepPlan short_static = plan_static(short_lengths, s, 2);
      ASSERT_NO_THROW(check_plan(short_static, short_lengths, layers, stages));
      EXPECT_FALSE(short_static.rings.empty());
      for (const Ring& ring : short_static.rings) EXPECT_EQ(ring.ranks.size(), 2u);
    }
  }
  EXPECT_GT(rings_seen, 250);
  EXPECT_GT(offloaded, 25);
}

}  // namespace
}  // namespace hdp
