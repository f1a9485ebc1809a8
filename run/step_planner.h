#pragma once
// The run's batch source: what each step of a training run trains on. The
// policy and its settings come from the config (scheduler.*, data.*, parallel.*,
// offload.*) and the profiled costs (run/planner_cost.h); each step the sampler
// (data/sampler.h) draws the global batch's sequences, the policy's planner
// (planning/hdp_planner.h) places them on the hdp ranks, the plan is checked,
// rank_work (planning/plan.h) gives this rank its micro-batches and their rings,
// and data/materialize.h reads their tokens. The remote loader's scheduler plans
// with the same class (run/loader_roles.h). It lives in run/ because it reads the
// config and the profiled costs; the planning itself is planning/'s.

#include <cstdint>
#include <span>
#include <vector>

#include "config/config.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "planning/cost_model.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"
#include "whatif/step_simulation.h"

namespace hdp {

// The sampler options of the data config.
SamplerOptions sampler_options(const DataConfig& data);

// Recomputation planned per micro-batch (train.recompute_per_micro_batch,
// may_plan_recompute): the most of a stage's first layers a micro-batch may
// recompute (train.recompute_layers, all by default, of the smallest stage; 0 when
// the config plans none), and the share of a whole layer's saved bytes per token a
// recomputed layer keeps under train.recompute (spec/model_shape.h's
// saved_bytes_per_token in train.precision, a ring layer's when rings may form:
// the larger), which is the planners' rho (recomputed_layer_share).
int64_t most_planned_recompute_layers(const Config& config);
double recomputed_bytes_share(const Config& config);

// The planner settings the memory limits read, one definition for StepPlanner and
// the engine's activation memory (largest_micro_batch): the capacity, the smallest
// stage's layers, the pipeline stages, offload (data.*, parallel.*, offload.*), the
// cost `layer` of a whole layer, and under may_plan_recompute the recomputation
// (up to most_planned_recompute_layers, keeping recomputed_bytes_share of layer's a2
// and b2, its rerun priced at flops_per_second when that is positive).
PlannerSettings memory_planner_settings(const Config& config, const CostModel& layer, double flops_per_second);

// What the cost model predicts of a step's plan.
struct StepPrediction {
  std::vector<double> busy_s;  // per hdp rank: forward and backward seconds (predicted_rank_seconds)
  // The step time no plan of these sequences beats under the run's costs
  // (planning/step_bound.h; the gradient synchronisation, which the costs do not
  // price, left out).
  double bound_s = 0;
  // The plan's step as the step simulator replays it with the run's costs
  // (run/step_costs.h): pipeline bubbles, ring waits, transfers and the gradient
  // synchronisation included.
  double step_s = 0;
  // Puts hdp rank `hdp_rank`'s and the busiest rank's busy seconds, the bound and the
  // simulated step into the batch.
  void fill(int hdp_rank, GlobalBatch& batch) const;
};

class StepPlanner {
 public:
  // cost: the planner's cost model (planning/cost_file.h); under parallel.ep > 1 the
  // planner adds expert_all_to_all_seconds_per_token to its b1 and couples each ep
  // group's predicted times (PlannerSettings::ep). With train.recompute it prices the
  // rerun of the recomputed layers (price_recomputation at the FLOP rate the cost's
  // linear term implies, as the share train.recompute_layers is of the smallest
  // stage's layers), which the cost files and the derived model leave out. With
  // may_plan_recompute instead every layer's cost is a whole layer's, and the
  // planners choose per micro-batch above the capacity how many layers recompute
  // (PlannerSettings::recompute: up to most_planned_recompute_layers, keeping
  // recomputed_bytes_share of cost.a2 and b2, rerunning at that rate) beside the
  // offload ratio, by planning/activation_mix.h's rule. Throws ConfigError when
  // the longest sequence (data.max_seq_len) cannot be placed on parallel.hdp ranks.
  StepPlanner(const Config& config, const CostModel& cost);

  // The plan of a global batch with sequences of these lengths, checked. Under the
  // balance policy with parallel.pp > 1 the candidates are compared by their
  // simulated steps (BalanceSettings::step_seconds, whatif/step_measure.h, with
  // step_costs()), which see PP-Balance's waves, pipeline bubbles and ring waits, as
  // `trainer plan` compares them; with one stage by the busiest rank's predicted time
  // (DP-Balance's own measure). The simulation is deterministic: every rank, given the
  // same sequences and cost model, makes the same plan.
  StepPlan plan(std::span<const int64_t> lengths) const;
  // The plan's predictions (one simulation of its step).
  StepPrediction predict(const StepPlan& plan, std::span<const int64_t> lengths) const;
  // predict(plan, lengths).fill(hdp_rank, batch).
  void predict(const StepPlan& plan, std::span<const int64_t> lengths, int hdp_rank, GlobalBatch& batch) const;
  // The next global batch with this rank's planned micro-batches read.
  GlobalBatch next_local_batch(BatchSampler& sampler, const TokenDataset& dataset, int hdp_rank) const;

  const PlannerSettings& settings() const { return settings_; }
  const BalanceSettings& balance_settings() const { return balance_; }  // without the step measure
  const StepCosts& step_costs() const { return step_costs_; }

 private:
  SchedulerPolicy policy_;
  int cp_;
  int chunks_;  // parallel.vpp: the ring order is checked in the interleaved 1F1B order
  PlannerSettings settings_;
  PlannerSettings bound_settings_;  // settings_ with the rerun priced for the lower bound
  std::vector<int64_t> stage_layers_;  // layers of each pipeline stage
  BalanceSettings balance_;
  StepCosts step_costs_;               // the step simulator's, of this run (run/step_costs.h)
  bool simulate_candidates_ = false;   // balance with pp > 1: candidates compared by the simulated step
};

}  // namespace hdp
