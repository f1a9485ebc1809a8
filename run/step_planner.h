#pragma once
// How the training loop turns a global batch into this rank's work: the step's
// plan from the configured policy (planning/hdp_planner.h), checked before it
// runs, and this rank's micro-batches read from the dataset.

#include <cstdint>
#include <span>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "planning/cost_model.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"
#include "config/config.h"

namespace hdp {

// The sampler options of the data config.
SamplerOptions sampler_options(const DataConfig& data);

// This rank's micro-batches of a plan, read from the dataset, each with the layout
// of its ring when it takes part in one.
std::vector<PackedMicroBatch> local_micro_batches(const TokenDataset& dataset, std::span<const SequenceSpan> sequences,
                                                  const StepPlan& plan, int hdp_rank);

class StepPlanner {
 public:
  // cost: the planner's cost model (planning/cost_file.h); under parallel.ep > 1 the
  // planner adds expert_all_to_all_seconds_per_token to its b1 and couples each ep
  // group's predicted times (PlannerSettings::ep). Throws ConfigError when
  // the longest sequence (data.max_seq_len) cannot be placed on parallel.hdp ranks.
  StepPlanner(const Config& config, const CostModel& cost);

  // The plan of a global batch with sequences of these lengths, checked.
  StepPlan plan(std::span<const int64_t> lengths) const;
  // Puts the plan's predicted busy seconds of hdp rank `hdp_rank` and of the busiest
  // rank into the batch.
  void predict(const StepPlan& plan, std::span<const int64_t> lengths, int hdp_rank, GlobalBatch& batch) const;
  // The next global batch with this rank's planned micro-batches read.
  GlobalBatch next_local_batch(BatchSampler& sampler, const TokenDataset& dataset, int hdp_rank) const;

  const PlannerSettings& settings() const { return settings_; }

 private:
  SchedulerPolicy policy_;
  int cp_;
  PlannerSettings settings_;
  BalanceSettings balance_;
};

}  // namespace hdp
