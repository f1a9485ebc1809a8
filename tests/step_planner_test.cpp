// The run's step planner (run/step_planner.h): the prediction each step carries, the
// busiest rank's planned busy time and the step's lower bound under the run's costs
// (planning/step_bound.h), which metrics.jsonl reports as planned_bound_ms.

#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/pipeline_layers.h"
#include "data/batch.h"
#include "planning/activation_mix.h"
#include "planning/hdp_planner.h"
#include "run/engine.h"
#include "run/step_costs.h"
#include "run/step_planner.h"
#include "trainer/plan_command.h"
#include "whatif/step_measure.h"
#include "whatif/step_simulation.h"

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

// The rerun of recomputed layers is in the prediction. The default model (hidden 128,
// 4 heads and 4 KV heads of 32, FFN 352) runs 6 x (128 x 384 + 128 x 128 + 3 x 128 x
// 352) = 1,204,224 matmul FLOPs per token and 12 x 128 = 1,536 per pair, so b1 = 1e-3 s
// implies (1,204,224 + 768) / 1e-3 = 1.204992e9 FLOP/s. Full recomputation reruns q, k,
// v, o (2 x (128 x 384 + 128 x 128) = 131,072 per token), gate and up (4 x 128 x 352 =
// 180,224) and attention (4 x 128 = 512 per pair): R(200) = (256 x 200^2 + (311,296 +
// 256) x 200) / 1.204992e9 = 72,550,400 / 1.204992e9 s. Both sequences fit one
// 512-token micro-batch of the busiest rank: 2 x (4 T(200) + 200 x 2e-3 s of head) =
// 2.72 s, plus 2 R(200) per recomputed layer.
TEST(StepPlanner, PredictionCountsTheRerunOfRecomputedLayers) {
  const std::vector<int64_t> lengths = {200, 200};
  const double rerun = 72'550'400.0 / 1.204992e9;
  auto busiest = [&](RecomputeMode mode, std::optional<int64_t> layers) {
    Config c = two_ranks(1);
    c.train.recompute = mode;
    c.train.recompute_layers = layers;
    StepPlanner planner(c, costs());
    GlobalBatch batch;
    planner.predict(planner.plan(lengths), lengths, 0, batch);
    EXPECT_NEAR(batch.planned_busy_s, batch.planned_max_busy_s, 1e-12);
    return batch.planned_max_busy_s;
  };
  EXPECT_NEAR(busiest(RecomputeMode::None, std::nullopt), 2.72, 1e-12);
  EXPECT_NEAR(busiest(RecomputeMode::Full, 1), 2.72 + 2 * rerun, 1e-12);
  EXPECT_NEAR(busiest(RecomputeMode::Full, std::nullopt), 2.72 + 8 * rerun, 1e-12);
  // Selective reruns the norms, which the counts leave out.
  EXPECT_NEAR(busiest(RecomputeMode::Selective, std::nullopt), 2.72, 1e-12);
}

// train.recompute_layers counts from each model chunk's first layer, so under interleaved
// 1F1B a stage recomputes it once per chunk (the default model's 4 layers: pp 2 x vpp 2
// gives every stage two chunks of 1 layer).
TEST(StepPlanner, RecomputedLayersCountPerModelChunk) {
  Config c = two_ranks(1);
  c.parallel.pp = 2;
  c.train.recompute = RecomputeMode::Full;
  c.train.recompute_layers = 1;
  EXPECT_EQ(recomputed_layers_per_stage(c), (std::vector<int64_t>{1, 1}));
  c.parallel.vpp = 2;
  EXPECT_EQ(smallest_stage_layers(c), 2);
  EXPECT_EQ(recomputed_layers_per_stage(c), (std::vector<int64_t>{2, 2}));
  c.train.recompute_layers.reset();
  EXPECT_EQ(recomputed_layers_per_stage(c), (std::vector<int64_t>{2, 2}));
  c.train.recompute = RecomputeMode::None;
  EXPECT_EQ(recomputed_layers_per_stage(c), (std::vector<int64_t>{0, 0}));
}

// The lower bound prices a stage's rerun at the least share of its layers any stage
// recomputes, so it never charges a stage more reruns than it makes. Stages of 1 and 3
// layers with train.recompute_layers 1 rerun 1 layer each: the last stage, which binds
// the bound here, is charged a third of what recomputing all its 3 layers adds (the
// smallest stage's share, 1 of 1, would charge it all 3).
TEST(StepPlanner, TheBoundChargesNoStageMoreRerunsThanItMakes) {
  const std::vector<int64_t> lengths = {200, 200};
  auto bound = [&](RecomputeMode mode, std::optional<int64_t> layers) {
    Config c = two_ranks(2);
    c.train.recompute = mode;
    c.train.recompute_layers = layers;
    StepPlanner planner(c, costs());
    GlobalBatch batch;
    planner.predict(planner.plan(lengths), lengths, 0, batch);
    return batch.planned_bound_s;
  };
  const double none = bound(RecomputeMode::None, std::nullopt);
  const double one = bound(RecomputeMode::Full, 1) - none, all = bound(RecomputeMode::Full, std::nullopt) - none;
  EXPECT_GT(one, 0);
  EXPECT_NEAR(3 * one, all, 1e-12);
}

// Recomputation planned per micro-batch (train.recompute_per_micro_batch): the step
// planner chooses, for a micro-batch above the capacity, the mix of recomputed layers
// and offload ratio that planning/activation_mix.h's rule prices cheapest. One rank,
// the default model's 4 layers (fp32: a whole layer saves 8 x 128 + 2 x 352 = 1728
// row values and 6 small ones per token, 6936 bytes; full keeps the 128-value input,
// 512 bytes, rho = 512 / 6936), C = 512. A 600-token sequence needs l C / t =
// 2048 / 600 = 3.41 layers' worth held: without recomputation the two offloadable
// layers must send r >= 1 - 1.41 / 2 = 0.293 of their rows to the host; one
// recomputed layer fits with r = 0 (rho + 3 <= 3.41). Its rerun, R(600) = (256 x
// 600^2 + 311,552 x 600) / 1.204992e9 = 0.2316 s (the FLOPs of the test above), is
// cheaper than copies at 1 MB/s (each offloaded layer's 0.293 x 6936 x 600 bytes take
// 1.22 s each way, beyond the layer's forward (0.32 s) and backward (0.64 s) of
// T(600) = 0.96 s) but not than copies at 1 GB/s, which hide under the compute. The
// 300-token sequence fits the capacity: nothing recomputes or offloads.
TEST(StepPlanner, ChoosesTheMixOfRecomputationAndOffloadTheCostRulePrices) {
  const std::vector<int64_t> lengths = {600, 300};
  auto plan_with = [&](double copy_bytes_per_s, std::optional<int64_t> most_layers) {
    Config c = two_ranks(1);
    c.parallel.hdp = 1;
    c.data.max_seq_len = 600;
    c.train.recompute = RecomputeMode::Full;
    c.train.recompute_layers = most_layers;
    c.train.recompute_per_micro_batch = true;
    CostModel cost = costs();
    cost.a2 = 6936;
    cost.d2h_bytes_per_s = cost.h2d_bytes_per_s = copy_bytes_per_s;
    const StepPlanner planner(c, cost);
    EXPECT_DOUBLE_EQ(recomputed_bytes_share(c), 512.0 / 6936.0);
    EXPECT_EQ(most_planned_recompute_layers(c), most_layers.value_or(4));
    const StepPlan plan = planner.plan(lengths);
    // The rule itself, for the long micro-batch on its own.
    const ActivationMixSettings ms = activation_mix_settings(planner.settings());
    const std::optional<ActivationMix> rule = choose_activation_mix(600, false, cost.compute_seconds(600), ms);
    EXPECT_TRUE(rule.has_value());
    const PlannedMicroBatch* long_mb = nullptr;
    for (const PlannedMicroBatch& mb : plan.ranks.at(0)) {
      if (mb.tokens() == 600) {
        long_mb = &mb;
      } else {
        EXPECT_EQ(mb.recompute_layers, 0);
        EXPECT_EQ(mb.offload_ratio, 0);
      }
    }
    EXPECT_NE(long_mb, nullptr);
    if (long_mb != nullptr && rule && most_layers != 0) {
      EXPECT_EQ(long_mb->recompute_layers, rule->recompute_layers);
      EXPECT_EQ(long_mb->offload_ratio, rule->offload_ratio);
    }
    return long_mb != nullptr ? *long_mb : PlannedMicroBatch{};
  };
  const PlannedMicroBatch slow = plan_with(1e6, std::nullopt);
  EXPECT_EQ(slow.recompute_layers, 1);
  EXPECT_EQ(slow.offload_ratio, 0);
  const PlannedMicroBatch fast = plan_with(1e9, std::nullopt);
  EXPECT_EQ(fast.recompute_layers, 0);
  EXPECT_NEAR(fast.offload_ratio, 1 - 1.41333333333 / 2, 1e-9);
  // train.recompute_layers bounds the choice: 0 layers leaves offload alone (as
  // ByteScale plans it: the smallest ratio that fits on as few ranks).
  const PlannedMicroBatch none = plan_with(1e9, 0);
  EXPECT_EQ(none.recompute_layers, 0);
  EXPECT_NEAR(none.offload_ratio, 1 - 1.41333333333 / 2, 1e-9);
}

// The engine sizes its activation memory by the planners' bound on a mix's tokens
// (largest_mix_tokens of the step planner's settings), within the longest sequence,
// and its host pool by the offload-only limit, l C / 2 = 1024 tokens at C = 512 and
// 4 layers: micro-batches above it recompute layers and park rows of fewer layers.
TEST(StepPlanner, TheEngineHoldsTheLargestMixThePlannersAdmit) {
  for (const int64_t longest : {int64_t{4000}, int64_t{1200}}) {
    Config c = two_ranks(1);
    c.data.max_seq_len = longest;
    c.offload.enabled = true;
    c.train.recompute = RecomputeMode::Full;
    c.train.recompute_per_micro_batch = true;
    CostModel cost = costs();
    cost.a2 = 6936;
    const StepPlanner planner(c, cost);
    const int64_t most = largest_mix_tokens(activation_mix_settings(planner.settings()));
    EXPECT_GT(most, 1200);
    EXPECT_EQ(largest_micro_batch(c), std::min(most, longest)) << longest;
    EXPECT_EQ(largest_offloaded_micro_batch(c), 1024) << longest;
  }
}


// The step the plan is predicted to take, as the step simulator replays it with the
// run's costs (planned_step_ms). One rank holds both sequences in one micro-batch: 2.72
// s of compute (the prediction test above), then the optimizer on the whole model,
// 32 bytes of traffic per parameter at the copy bandwidth (1e9 bytes/s), no gradient
// synchronisation over one rank. The default model holds 4 x (128 x 384 + 128 x 128 +
// 3 x 128 x 352 + 2 x 128) + 2 x 258 x 128 + 128 = 870,016 parameters.
TEST(StepPlanner, PredictionCarriesTheSimulatedStep) {
  const std::vector<int64_t> lengths = {200, 200};
  Config c = two_ranks(1);
  c.parallel.hdp = 1;
  const StepPlanner planner(c, costs());
  const StepPrediction p = planner.predict(planner.plan(lengths), lengths);
  EXPECT_NEAR(p.step_s, 2.72 + 32 * 870'016 / 1e9, 1e-9);
  GlobalBatch batch;
  p.fill(0, batch);
  EXPECT_EQ(batch.planned_step_s, p.step_s);
  EXPECT_EQ(batch.planned_bound_s, p.bound_s);
  EXPECT_EQ(batch.planned_max_busy_s, 2.72);
}

// The run's step costs: the run's own layer, embedding and head times; transfers at
// the copy bandwidth without latency; bytes in train.precision (fp32 here: K and V of
// 4 KV heads of 32 are 1,024 bytes per token and layer, the 128-value activation
// between stages 512).
TEST(StepPlanner, TheSimulatorRunsOnTheRunsOwnCostsAndCopyBandwidth) {
  CostModel cost = costs();
  cost.embedding_seconds_per_token = 1e-4;
  cost.d2h_bytes_per_s = 3e9;
  const StepCosts k = run_step_costs(two_ranks(2), cost, CostModel{});
  EXPECT_EQ(k.cost.a1, cost.a1);
  EXPECT_EQ(k.cost.b1, cost.b1);
  EXPECT_EQ(k.embedding_seconds_per_token, 1e-4);
  EXPECT_EQ(k.head_seconds_per_token, 2e-3);
  EXPECT_EQ(k.stage_layers, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(k.hardware.link_bytes_per_s(0, 3), 1e9);
  EXPECT_EQ(k.hardware.link_latency_s(0, 3), 0);
  EXPECT_EQ(k.kv_bytes_per_token, 1024);
  EXPECT_EQ(k.boundary_bytes_per_token, 512);
  cost.h2d_bytes_per_s = 0;
  EXPECT_THROW(run_step_costs(two_ranks(2), cost, CostModel{}), ConfigError);
}

// Every rank of hdp rank r's sequences, micro-batches and rings, in order.
std::string describe(const StepPlan& plan) {
  std::ostringstream out;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    out << "rank " << r << ":";
    for (const PlannedMicroBatch& mb : plan.ranks[r]) {
      out << " [";
      for (const PlannedPiece& p : mb.pieces) out << " " << p.sequence << "@" << p.offset << "+" << p.length << "r" << p.ring;
      out << " ] ";
    }
    out << "\n";
  }
  for (const Ring& g : plan.rings) {
    out << "ring:";
    for (int r : g.ranks) out << " " << r;
    out << "\n";
  }
  return out.str();
}

// Under pipelines the balance policy compares its candidates by the simulated step of
// the run's costs, as `trainer plan`'s balance does: given the trainer's settings and
// step costs, `trainer plan`'s balance makes the trainer's plan. For these sequences
// (long ones needing rings of 2 to 4 of the 4 ranks, and short ones) the measure
// changes the plan: without it plan_balance picks another one, so the check fails
// when the step planner does not pass the measure.
TEST(StepPlanner, BalanceUnderPipelinesIsTrainerPlansBalanceOnTheRunsCosts) {
  Config c = two_ranks(2);
  c.parallel.hdp = 4;
  c.scheduler.policy = SchedulerPolicy::Balance;
  c.data.max_seq_len = 2000;
  c.offload.enabled = false;
  const StepPlanner planner(c, costs());
  const std::vector<int64_t> lengths = {1900, 1500, 1100, 700, 600, 300, 200, 200, 100, 100, 60};
  PlanSetup setup;
  setup.settings = planner.settings();
  setup.costs = planner.step_costs();
  setup.balance = planner.balance_settings();
  ASSERT_EQ(setup.balance.mode, BalanceMode::Pipeline);
  const StepPlan trainer = planner.plan(lengths);
  EXPECT_EQ(describe(trainer), describe(plan_policy("balance")(lengths, setup)));
  const StepPlan unmeasured = plan_balance(lengths, setup.settings, setup.balance);
  EXPECT_NE(describe(trainer), describe(unmeasured));
  const auto step = simulated_step_measure(lengths, setup.costs);
  EXPECT_LT(step(trainer), step(unmeasured));
  std::printf("simulated step: %.3f s with the measure, %.3f s without\n", step(trainer), step(unmeasured));
}

}  // namespace
}  // namespace hdp
