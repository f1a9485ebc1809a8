// Interleaved 1F1B (planning/pipeline_schedule.h): hand-worked orders, the
// invariants every order must keep, deadlock freedom when the stages wait for
// each other's transfers, and the bubble a replay of the order measures against
// Narayanan et al. 2021's (p - 1) / (vpp m).

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "planning/pipeline_schedule.h"

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
double replay(int stages, int chunks, int m, double forward, double backward, const std::string& what) {
  const int virtual_stages = stages * chunks;
  std::vector<std::vector<PipelineOp>> orders;
  for (int s = 0; s < stages; ++s) orders.push_back(pipeline_schedule(s, stages, chunks, m));
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
          if (m % stages == 0) EXPECT_EQ(max_in_flight, std::min(pipeline_slots(s, stages, chunks), chunks * m)) << what;
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

}  // namespace
}  // namespace hdp
