// The run's step planner (run/step_planner.h): the prediction each step carries, the
// busiest rank's planned busy time and the step's lower bound under the run's costs
// (planning/step_bound.h), which metrics.jsonl reports as planned_bound_ms.

#include <gtest/gtest.h>

#include <vector>

#include "config/config.h"
#include "data/batch.h"
#include "run/step_planner.h"

namespace hdp {
namespace {

// T(s) = 1e-6 s^2 + 1e-3 s seconds per layer, the head 2e-3 s per token: T(1000) = 2,
// T(200) = 0.24.
CostModel costs() {
  CostModel c;
  c.a1 = 1e-6;
  c.b1 = 1e-3;
  c.a2 = 1;
  c.d2h_bytes_per_s = c.h2d_bytes_per_s = 1e9;
  c.head_seconds_per_token = 2e-3;
  return c;
}

Config two_ranks(int pp) {
  Config c;
  c.source = "configs/test.yaml";
  c.parallel.hdp = 2;
  c.parallel.pp = pp;
  if (pp == 2) c.parallel.pp_layers = {1, 3};  // the default model's 4 layers
  c.data.micro_batch_tokens = 512;
  return c;
}

TEST(StepPlanner, PredictionCarriesTheStepsLowerBound) {
  const std::vector<int64_t> lengths = {1000, 200};
  // One stage of 4 layers: 4 x 2.24 s of layers and 1200 x 2e-3 s of head over 2 ranks,
  // 5.68 s, above the 1000-token sequence on both ranks (4 x (1 / 2 + 0.5) + 1 = 5 s).
  StepPlanner one(two_ranks(1), costs());
  GlobalBatch batch;
  one.predict(one.plan(lengths), lengths, 0, batch);
  EXPECT_NEAR(batch.planned_bound_s, 5.68, 1e-12);
  EXPECT_LE(batch.planned_bound_s, batch.planned_max_busy_s * (1 + 1e-12));
  // Stages of 1 and 3 layers: the busiest stage's work is 3 x 2.24 / 2 + 1.2 = 4.56 s,
  // but the long sequence passes both stages, forward and back: 1 + 3 + 1 = 5 s.
  StepPlanner two(two_ranks(2), costs());
  two.predict(two.plan(lengths), lengths, 1, batch);
  EXPECT_NEAR(batch.planned_bound_s, 5.0, 1e-12);
}

}  // namespace
}  // namespace hdp
