// Interleaved 1F1B (planning/pipeline_schedule.h): hand-worked orders, the
// invariants every order must keep, deadlock freedom when the stages wait for
// each other's transfers, and the bubble a replay of the order measures against
// Narayanan et al. 2021's (p - 1) / (vpp m). 1F1B with deeper warm-ups: orders,
// the rule that keeps them free of deadlock, the depth memory allows, and
// check_plan's memory check of a plan's warm-ups.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "planning/pipeline_schedule.h"
#include "planning/plan.h"

namespace hdp {
namespace {

// "F0.0 F1.0 B0.1 ..." (direction, micro-batch, chunk).
std::string ops_string(const std::vector<PipelineOp>& ops) {
  std::string s;
  for (const PipelineOp& op : ops) {
    if (!s.empty()) s += ' ';
    s += (op.forward ? 'F' : 'B') + std::to_string(op.micro_batch) + '.' + std::to_string(op.chunk);
  }
  return s;
}

TEST(InterleavedOneFOneB, HandWrittenTwoStagesTwoChunksFourMicroBatches) {
  // Virtual stages: stage 0 holds 0 and 2, stage 1 holds 1 and 3. Forwards run in
  // groups of two micro-batches through chunk 0 then chunk 1; backwards through
  // chunk 1 then chunk 0. Warm-up: 2 (2 - 0 - 1) + (2 - 1) 2 = 4 on stage 0, 2 on stage 1.
  EXPECT_EQ(ops_string(interleaved_one_f_one_b(0, 2, 2, 4)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(ops_string(interleaved_one_f_one_b(1, 2, 2, 4)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

TEST(InterleavedOneFOneB, RemainderGroupAndShortSteps) {
  // Three micro-batches over two stages: the order of four (above) without micro-batch 3.
  EXPECT_EQ(ops_string(interleaved_one_f_one_b(1, 2, 2, 3)), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 B1.0 F2.1 B2.1 B2.0");
  // One micro-batch: the warm-up takes every forward.
  EXPECT_EQ(ops_string(interleaved_one_f_one_b(0, 2, 2, 1)), "F0.0 F0.1 B0.1 B0.0");
  EXPECT_EQ(ops_string(interleaved_one_f_one_b(0, 3, 2, 0)), "");
}

TEST(PipelineSchedule, OneChunkIsOneFOneB) {
  for (int stages = 1; stages <= 4; ++stages)
    for (int stage = 0; stage < stages; ++stage)
      for (int m = 0; m <= 6; ++m)
        EXPECT_EQ(ops_string(pipeline_schedule(stage, stages, 1, m)), ops_string(one_f_one_b(stage, stages, m)));
}

TEST(PipelineSchedule, RefusesChunksWithoutStagesToInterleave) {
  EXPECT_THROW(pipeline_schedule(0, 1, 2, 4), std::invalid_argument);
  EXPECT_THROW(pipeline_schedule(0, 2, 0, 4), std::invalid_argument);
}

// Replays every stage's order with forwards of `forward` and backwards of `backward`
// seconds per chunk and free transfers: an op starts when its stage is free and the
// op it waits for (the previous virtual stage's forward, the next one's backward,
// its own forward) has ended. Returns the makespan; fails the test on a deadlock.
// With limits, one chunk per stage and those forward limits.
double replay(int stages, int chunks, int m, double forward, double backward, const std::string& what,
              const std::vector<std::vector<int>>& limits = {}) {
  const int virtual_stages = stages * chunks;
  std::vector<std::vector<PipelineOp>> orders;
  for (int s = 0; s < stages; ++s) orders.push_back(pipeline_schedule(s, stages, chunks, m, limits));
  std::map<std::tuple<bool, int, int>, double> end;  // (forward, micro-batch, virtual stage) -> end
  std::vector<size_t> next(stages, 0);
  std::vector<double> free(stages, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < orders[s].size()) {
        const PipelineOp& op = orders[s][next[s]];
        const int v = op.chunk * stages + s;
        double ready = free[s];
        std::vector<std::tuple<bool, int, int>> needs;
        if (op.forward && v > 0) needs.emplace_back(true, op.micro_batch, v - 1);
        if (!op.forward) needs.emplace_back(true, op.micro_batch, v);
        if (!op.forward && v + 1 < virtual_stages) needs.emplace_back(false, op.micro_batch, v + 1);
        bool blocked = false;
        for (const auto& n : needs) {
          auto it = end.find(n);
          if (it == end.end()) blocked = true; else ready = std::max(ready, it->second);
        }
        if (blocked) break;
        free[s] = ready + (op.forward ? forward : backward);
        end[{op.forward, op.micro_batch, v}] = free[s];
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s)
    EXPECT_EQ(next[s], orders[s].size()) << what << ": stage " << s << " deadlocks at op " << next[s];
  return *std::max_element(free.begin(), free.end());
}

TEST(InterleavedOneFOneB, EveryOrderIsCompleteAndDeadlockFree) {
  for (int stages = 2; stages <= 5; ++stages)
    for (int chunks = 1; chunks <= 4; ++chunks)
      for (int m = 1; m <= 13; ++m) {
        const std::string what = "pp " + std::to_string(stages) + " vpp " + std::to_string(chunks) + " m " +
                                 std::to_string(m);
        for (int s = 0; s < stages; ++s) {
          const std::vector<PipelineOp> ops = pipeline_schedule(s, stages, chunks, m);
          ASSERT_EQ(ops.size(), static_cast<size_t>(2 * chunks * m)) << what;
          std::map<std::pair<int, int>, size_t> forward_at;
          std::map<std::pair<int, int>, int> seen;
          int in_flight = 0, max_in_flight = 0;
          for (size_t k = 0; k < ops.size(); ++k) {
            const std::pair<int, int> key{ops[k].micro_batch, ops[k].chunk};
            ASSERT_TRUE(key.first >= 0 && key.first < m && key.second >= 0 && key.second < chunks) << what;
            if (ops[k].forward) {
              EXPECT_FALSE(forward_at.count(key)) << what << ": a forward twice";
              forward_at[key] = k;
              max_in_flight = std::max(max_in_flight, ++in_flight);
            } else {
              EXPECT_TRUE(forward_at.count(key)) << what << ": backward of " << key.first << "." << key.second
                                                 << " before its forward on stage " << s;
              --in_flight;
            }
            ++seen[key];
          }
          EXPECT_EQ(seen.size(), static_cast<size_t>(chunks * m)) << what;
          for (const auto& [key, n] : seen) EXPECT_EQ(n, 2) << what;
          // The executor keeps a buffer per in-flight (micro-batch, chunk): never more than its slots.
          EXPECT_LE(max_in_flight, pipeline_slots(s, stages, chunks)) << what;
          if (m % stages == 0) {
            EXPECT_EQ(max_in_flight, std::min(pipeline_slots(s, stages, chunks), chunks * m)) << what;
          }
        }
        replay(stages, chunks, m, 1.0, 2.0, what);
      }
}

TEST(PipelineBubble, FormulaShrinksByTheChunks) {
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 1, 8), 3.0 / 8);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 2, 8), 3.0 / 16);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(2, 4, 4), 1.0 / 16);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(1, 1, 5), 0.0);
}

TEST(PipelineBubble, ReplayedOrderMeetsTheFormula) {
  // A stage's whole forward takes 1 and backward 2 per micro-batch, split evenly
  // over its chunks: the ideal step is 3 m, the bubble (p - 1) 3 / vpp when m is a
  // multiple of p (Narayanan et al. 2021, section 2.2.2).
  for (int stages = 2; stages <= 4; ++stages)
    for (int chunks = 1; chunks <= 3; ++chunks)
      for (int m = stages; m <= 3 * stages; m += stages) {
        const std::string what = "pp " + std::to_string(stages) + " vpp " + std::to_string(chunks) + " m " +
                                 std::to_string(m);
        const double step = replay(stages, chunks, m, 1.0 / chunks, 2.0 / chunks, what);
        const double ideal = 3.0 * m;
        EXPECT_NEAR((step - ideal) / ideal, pipeline_bubble_fraction(stages, chunks, m), 1e-9) << what;
      }
}

// "F0 F1 B0 ..." of a one-chunk order.
std::string flat_string(const std::vector<PipelineOp>& ops) {
  std::string s;
  for (const PipelineOp& op : ops) s += (s.empty() ? "" : " ") + std::string(op.forward ? "F" : "B") + std::to_string(op.micro_batch);
  return s;
}

// Forward limits of a constant warm-up w over m backwards: k + w.
std::vector<int> ahead(int m, int w) {
  std::vector<int> limits;
  for (int k = 0; k < m; ++k) limits.push_back(k + w);
  return limits;
}

TEST(DeeperWarmup, HandWrittenOrders) {
  EXPECT_EQ(flat_string(forwards_ahead_of_backwards(5, ahead(5, 4))), "F0 F1 F2 F3 F4 B0 B1 B2 B3 B4");
  EXPECT_EQ(flat_string(forwards_ahead_of_backwards(5, ahead(5, 3))), "F0 F1 F2 F3 B0 F4 B1 B2 B3 B4");
  EXPECT_EQ(flat_string(forwards_ahead_of_backwards(5, ahead(5, 0))), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4");
  // Limits that grow: three forwards before backward 0, then all of them.
  EXPECT_EQ(flat_string(forwards_ahead_of_backwards(5, std::vector<int>{2, 4, 4, 4, 4})),
            "F0 F1 F2 B0 F3 F4 B1 B2 B3 B4");
  // Entries beyond m, and limits beyond m - 1, change nothing.
  EXPECT_EQ(flat_string(forwards_ahead_of_backwards(3, std::vector<int>{9, 9, 9, 9})), "F0 F1 F2 B0 B1 B2");
  const std::vector<std::vector<int>> limits{{3, 4, 4, 4, 4}, {1, 2, 3, 4, 4}, {0, 1, 2, 3, 4}};
  EXPECT_EQ(flat_string(pipeline_schedule(0, 3, 1, 5, limits)), "F0 F1 F2 F3 B0 F4 B1 B2 B3 B4");
  EXPECT_EQ(flat_string(pipeline_schedule(1, 3, 1, 5, limits)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4");
  // 1F1B's limits give 1F1B's orders.
  for (int stages = 1; stages <= 4; ++stages)
    for (int m = 0; m <= 6; ++m) {
      std::vector<std::vector<int>> one_f_one_b_limits;
      for (int t = 0; t < stages; ++t) one_f_one_b_limits.push_back(ahead(m, stages - t - 1));
      for (int s = 0; s < stages; ++s)
        EXPECT_EQ(flat_string(pipeline_schedule(s, stages, 1, m, one_f_one_b_limits)),
                  flat_string(one_f_one_b(s, stages, m)));
    }
}

TEST(DeeperWarmup, OnlyLimitsNoStageRunsAheadOfTheOneBeforeAreValid) {
  EXPECT_NO_THROW(validate_forward_limits({{2, 3, 3}, {2, 2, 3}}, 2, 3));  // equal is valid
  EXPECT_THROW(validate_forward_limits({{1, 2, 3}, {2, 2, 3}}, 2, 3), std::invalid_argument);  // stage 1 ahead
  EXPECT_THROW(validate_forward_limits({{2, 3}, {1, 2}}, 2, 3), std::invalid_argument);  // too few entries
  EXPECT_THROW(validate_forward_limits({{2, 3, 3}}, 2, 3), std::invalid_argument);  // a list per stage
  EXPECT_THROW(forwards_ahead_of_backwards(2, std::vector<int>{0, 0}), std::invalid_argument);  // backward 1 before its forward
  EXPECT_THROW(forwards_ahead_of_backwards(3, std::vector<int>{2, 1, 2}), std::invalid_argument);  // decreasing
  EXPECT_THROW(pipeline_schedule(0, 2, 2, 2, {{1, 2}, {0, 1}}), std::invalid_argument);  // interleaved
}

// Random valid limits (each stage's at most the previous stage's) replay without a
// deadlock, with these forward and backward times. (Limits that run ahead of the
// previous stage's, which validate_forward_limits refuses, can deadlock: with 0, 1
// and 1, 1 stage 1 waits for forward 1 before its backward 0, and stage 0 sends
// forward 1 only after that backward.)
TEST(DeeperWarmup, ValidLimitsNeverDeadlock) {
  std::mt19937 rng(7);
  for (int stages = 2; stages <= 4; ++stages)
    for (int m = 1; m <= 7; ++m)
      for (int trial = 0; trial < 50; ++trial) {
        std::vector<std::vector<int>> limits(stages, std::vector<int>(m));
        std::string what = "pp " + std::to_string(stages) + " m " + std::to_string(m) + " limits";
        for (int s = 0; s < stages; ++s) {
          for (int k = 0; k < m; ++k) {
            const int low = std::max(k, k > 0 ? limits[s][k - 1] : 0);
            const int high = s > 0 ? limits[s - 1][k] : m + 1;
            limits[s][k] = std::uniform_int_distribution<int>(low, high)(rng);
            what += " " + std::to_string(limits[s][k]);
          }
          what += " |";
        }
        replay(stages, 1, m, 1.0, 2.0, what, limits);
        replay(stages, 1, m, 3.0, 0.5, what, limits);
      }
}

TEST(DeeperWarmup, DeepestLimitsTheMemoryAllows) {
  // Two stages, budgets 2 and 1 micro-batches at capacity. A full micro-batch, then
  // quarters: all five fit stage 0's budget at once (1 + 4 x 0.25 = 2).
  using Limits = std::vector<std::vector<int>>;
  EXPECT_EQ(deepest_forward_limits({{1, 0.25, 0.25, 0.25, 0.25}}, {}, 2), (Limits{{4, 4, 4, 4, 4}, {0, 1, 2, 3, 4}}));
  // Halves: 1 + 0.5 + 0.5 fit before backward 0, then all of them.
  EXPECT_EQ(deepest_forward_limits({{1, 0.5, 0.5, 0.5, 0.5}}, {}, 2), (Limits{{2, 4, 4, 4, 4}, {0, 1, 2, 3, 4}}));
  // Every rank must fit; beyond a rank's last micro-batch it holds nothing.
  EXPECT_EQ(deepest_forward_limits({{1, 0.25, 0.25, 0.25, 0.25}, {1, 1, 1}}, {}, 2),
            (Limits{{1, 4, 4, 4, 4}, {0, 1, 2, 3, 4}}));
  // Three stages, budgets 3, 2, 1; stage 1 stays one below stage 0 where memory would
  // let it run as far (backwards 2 and 3), and at 1F1B's at least (backward 4).
  EXPECT_EQ(deepest_forward_limits({{1, 1, 0.4, 0.4, 0.4, 0.4}}, {}, 3),
            (Limits{{3, 5, 5, 5, 5, 5}, {1, 3, 4, 4, 5, 5}, {0, 1, 2, 3, 4, 5}}));
  // Where 1F1B's own window exceeds a budget (a plan over its capacity), 1F1B's there.
  EXPECT_EQ(deepest_forward_limits({{1.5, 0.6, 0.1}}, {}, 2), (Limits{{1, 2, 2}, {0, 1, 2}}));
  EXPECT_TRUE(forward_limits_fit({{1, 0.5, 0.5, 0.5}}, {}, 0, 2, std::vector<int>{2, 3, 3, 3}));
  EXPECT_FALSE(forward_limits_fit({{1, 0.5, 0.5, 0.5}}, {}, 0, 2, std::vector<int>{3, 3, 3, 3}));
  EXPECT_TRUE(forward_limits_fit({{1, 0.5, 0.5, 0.5}}, {}, 1, 2, std::vector<int>{0, 1, 2, 3}));
  EXPECT_FALSE(forward_limits_fit({{1, 0.5, 0.5, 0.5}}, {}, 1, 2, std::vector<int>{1, 1, 2, 3}));
}

// Host memory holds offloaded rows for 1F1B's count in flight only (the planner sized
// each micro-batch's offload for it), so a window running ahead of 1F1B may hold at
// most p - s micro-batches that offload, however little they keep on the device.
TEST(DeeperWarmup, OffloadingMicroBatchesInFlightStayWithin1F1BsCount) {
  using Limits = std::vector<std::vector<int>>;
  const std::vector<std::vector<double>> quarters = {{1, 0.25, 0.25, 0.25, 0.25}};
  // The device holds all five before backward 0 (as above), but four offload: stage 0
  // runs forwards 0 ... 2 before backward 0 (two of them offload), then 1F1B's.
  EXPECT_EQ(deepest_forward_limits(quarters, {{0, 1, 1, 1, 1}}, 2), (Limits{{2, 2, 3, 4, 4}, {0, 1, 2, 3, 4}}));
  EXPECT_EQ(deepest_forward_limits(quarters, {{0, 1, 0, 0, 1}}, 2), (Limits{{4, 4, 4, 4, 4}, {0, 1, 2, 3, 4}}));
  EXPECT_FALSE(forward_limits_fit(quarters, {{0, 1, 1, 1, 1}}, 0, 2, std::vector<int>{4, 4, 4, 4, 4}));
  EXPECT_TRUE(forward_limits_fit(quarters, {{0, 1, 1, 1, 1}}, 0, 2, std::vector<int>{2, 2, 3, 4, 4}));
  // 1F1B's own windows are never refused: they hold at most p - s micro-batches.
  EXPECT_TRUE(forward_limits_fit(quarters, {{1, 1, 1, 1, 1}}, 0, 2, std::vector<int>{1, 2, 3, 4, 4}));
  EXPECT_THROW(deepest_forward_limits(quarters, {{0, 1, 1, 1}}, 2), std::invalid_argument);  // not kept's shape
  EXPECT_THROW(forward_limits_fit(quarters, {{0}, {0}}, 0, 2, std::vector<int>{1, 2, 3, 4, 4}), std::invalid_argument);
}

// One rank, capacity 4, one layer per stage: a micro-batch of 4 tokens, then `shorts`
// of `tokens` each, with forward limits `limits`.
StepPlan long_then_short_plan(int shorts, int64_t tokens, std::vector<std::vector<int>> limits,
                              std::vector<int64_t>& lengths) {
  StepPlan plan;
  plan.capacity = 4;
  plan.ranks.resize(1);
  lengths = {4};
  for (int i = 0; i < shorts; ++i) lengths.push_back(tokens);
  for (size_t q = 0; q < lengths.size(); ++q) {
    PlannedMicroBatch mb;
    mb.pieces.push_back({static_cast<int64_t>(q), 0, lengths[q], -1});
    plan.ranks[0].push_back(mb);
  }
  plan.forward_limits = std::move(limits);
  return plan;
}

// check_plan refuses the plan with a message that contains `why`.
void expect_check_plan_refuses(const StepPlan& plan, const std::vector<int64_t>& lengths, int64_t layers, int stages,
                               const std::string& why) {
  try {
    check_plan(plan, lengths, layers, stages);
    ADD_FAILURE() << "check_plan passed; expected: " << why;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(DeeperWarmup, CheckPlanRefusesLimitsMemoryDoesNotHold) {
  std::vector<int64_t> lengths;
  const std::vector<int> last_stage = ahead(5, 0);
  // Quarters: the device shares are 1, 0.25 x 4; stage 0 holds all five at once.
  StepPlan plan = long_then_short_plan(4, 1, {ahead(5, 4), last_stage}, lengths);
  EXPECT_EQ(plan_deepest_forward_limits(plan, 1, 2), (std::vector<std::vector<int>>{{4, 4, 4, 4, 4}, last_stage}));
  EXPECT_NO_THROW(check_plan(plan, lengths, 1, 2));
  // Halves: 1 + 0.5 x 4 = 3 micro-batches at capacity, stage 0 holds 2.
  plan = long_then_short_plan(4, 2, {ahead(5, 4), last_stage}, lengths);
  EXPECT_EQ(plan_deepest_forward_limits(plan, 1, 2), (std::vector<std::vector<int>>{{2, 4, 4, 4, 4}, last_stage}));
  expect_check_plan_refuses(plan, lengths, 1, 2,
                            "stage 0's forward limits keep more in flight than its 2 micro-batches");
  plan.forward_limits = {{2, 4, 4, 4, 4}, last_stage};
  EXPECT_NO_THROW(check_plan(plan, lengths, 1, 2));
  // The last stage's budget is one micro-batch: a forward ahead there holds 1.5.
  plan.forward_limits = {{2, 4, 4, 4, 4}, ahead(5, 1)};
  EXPECT_THROW(check_plan(plan, lengths, 1, 2), std::invalid_argument);
  plan.forward_limits = {ahead(5, 1), {2, 4, 4, 4, 4}};  // stage 1 ahead of stage 0
  EXPECT_THROW(check_plan(plan, lengths, 1, 2), std::invalid_argument);
  plan.forward_limits = {{2, 4, 4, 4, 4}, last_stage};
  EXPECT_THROW(check_plan(plan, lengths, 1, 2, 2), std::invalid_argument);  // interleaved
  // Recomputed layers keep less: with 20 layers, 10 recomputing at share 0.2 and no
  // offload, a micro-batch holds (10 x 0.2 + 2 + 8) / 20 = 0.6 of its tokens' whole bytes.
  PlannedMicroBatch mb;
  mb.pieces.push_back({0, 0, 4, -1});
  mb.recompute_layers = 10;
  EXPECT_DOUBLE_EQ(micro_batch_device_share(mb, 4, 20, 0.2), 0.6);
  mb.offload_ratio = 0.5;  // and half of the 8 offloadable layers' rows leave: (2 + 2 + 4) / 20
  EXPECT_DOUBLE_EQ(micro_batch_device_share(mb, 4, 20, 0.2), 0.4);
}

// Offloading short micro-batches keep little on the device but park rows in host
// memory, which holds 1F1B's count in flight: 3 layers per stage, a full micro-batch
// then four of one token offloading all they can (each keeps 1 x 2 / (3 x 4) = 1/6:
// 1 + 4/6 fits stage 0's 2 on the device, but four offload where host memory holds 2).
TEST(DeeperWarmup, CheckPlanRefusesMoreOffloadingMicroBatchesInFlightThan1F1Bs) {
  std::vector<int64_t> lengths;
  const std::vector<int> last_stage = ahead(5, 0);
  StepPlan plan = long_then_short_plan(4, 1, {ahead(5, 4), last_stage}, lengths);
  for (size_t i = 1; i < 5; ++i) plan.ranks[0][i].offload_ratio = 1;
  EXPECT_TRUE(micro_batch_offloads(plan.ranks[0][1], 3));
  EXPECT_FALSE(micro_batch_offloads(plan.ranks[0][0], 3));  // ratio 0
  EXPECT_FALSE(micro_batch_offloads(plan.ranks[0][1], 2));  // no layer to offload (l - 2 = 0)
  PlannedMicroBatch recomputing = plan.ranks[0][1];
  recomputing.recompute_layers = 1;  // 3 - 1 - 2 = 0 layers left to offload
  EXPECT_FALSE(micro_batch_offloads(recomputing, 3));
  EXPECT_EQ(plan_deepest_forward_limits(plan, 3, 2), (std::vector<std::vector<int>>{{2, 2, 3, 4, 4}, last_stage}));
  expect_check_plan_refuses(plan, lengths, 3, 2, "or more than 2 micro-batches that offload rows to host memory");
  plan.forward_limits = plan_deepest_forward_limits(plan, 3, 2);
  EXPECT_NO_THROW(check_plan(plan, lengths, 3, 2));
}

}  // namespace
}  // namespace hdp
