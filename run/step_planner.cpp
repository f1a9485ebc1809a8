#include "run/step_planner.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "run/engine.h"
#include "run/planner_cost.h"

namespace hdp {

StepPlanner::StepPlanner(const Config& config, const CostModel& cost)
    : policy_(config.scheduler.policy), cp_(static_cast<int>(config.scheduler.cp)) {
  settings_.hdp = config.parallel.hdp;
  settings_.capacity = config.data.micro_batch_tokens;
  settings_.layers_per_stage = planner_layers(config);
  settings_.pipeline_stages = config.parallel.pp;
  // Under expert parallelism every MoE layer's all-to-alls block it as its compute
  // does (a per-token term of the layer), and the ranks of an ep group run their
  // micro-batches in lock step.
  settings_.cost = cost;
  settings_.cost.b1 += expert_all_to_all_seconds_per_token(config, cost);
  settings_.ep = config.parallel.ep;
  settings_.offload.enabled = config.offload.enabled;
  settings_.offload.forced_ratio = config.offload.ratio;
  const SchedulerBalance balance = config.scheduler.balance;
  balance_.mode = balance == SchedulerBalance::Pipeline || (balance == SchedulerBalance::Auto && config.parallel.pp > 1)
                      ? BalanceMode::Pipeline
                      : BalanceMode::DataParallel;
  balance_.threshold = config.scheduler.threshold;
  if (policy_ != SchedulerPolicy::Static) {
    try {
      choose_ranks(config.data.max_seq_len, settings_);
    } catch (const std::invalid_argument& e) {
      throw ConfigError("data.max_seq_len " + std::to_string(config.data.max_seq_len) + ": " + e.what() +
                        "; lower data.max_seq_len, or raise parallel.hdp or data.micro_batch_tokens, or enable offload");
    }
  }
}

StepPlan StepPlanner::plan(std::span<const int64_t> lengths) const {
  StepPlan plan = policy_ == SchedulerPolicy::Static    ? plan_static(lengths, settings_, cp_)
                  : policy_ == SchedulerPolicy::Balance ? plan_balance(lengths, settings_, balance_)
                                                        : plan_naive(lengths, settings_);
  check_plan(plan, lengths, settings_.layers_per_stage, settings_.pipeline_stages);
  return plan;
}

SamplerOptions sampler_options(const DataConfig& data) {
  SamplerOptions o;
  o.max_seq_len = data.max_seq_len;
  o.global_batch_tokens = data.global_batch_tokens;
  o.micro_batch_tokens = data.micro_batch_tokens;
  o.shuffle = data.shuffle;
  o.seed = data.seed;
  return o;
}

std::vector<PackedMicroBatch> local_micro_batches(const TokenDataset& dataset, std::span<const SequenceSpan> sequences,
                                                  const StepPlan& plan, int hdp_rank) {
  std::vector<PackedMicroBatch> out;
  for (const PlannedMicroBatch& planned : plan.ranks[hdp_rank]) {
    PackedMicroBatch mb = materialize_planned(dataset, sequences, planned);
    if (planned.ring >= 0) {
      const Ring& ring = plan.rings[planned.ring];
      std::vector<int64_t> ring_lengths;
      for (int64_t s : ring.sequences) ring_lengths.push_back(sequences[s].length);
      int self = 0;
      while (ring.ranks[self] != hdp_rank) ++self;
      mb.ring_layout = zigzag_ring_layout(ring.ranks, ring_lengths, self);
    }
    out.push_back(std::move(mb));
  }
  return out;
}

void StepPlanner::predict(const StepPlan& plan, std::span<const int64_t> lengths, int hdp_rank,
                          GlobalBatch& batch) const {
  const std::vector<double> seconds = predicted_rank_seconds(plan, lengths, settings_);
  batch.planned_busy_s = seconds[hdp_rank];
  batch.planned_max_busy_s = *std::max_element(seconds.begin(), seconds.end());
}

GlobalBatch StepPlanner::next_local_batch(BatchSampler& sampler, const TokenDataset& dataset, int hdp_rank) const {
  GlobalBatch batch = sampler.next_plan();
  std::vector<int64_t> lengths;
  for (const SequenceSpan& s : batch.sequences) lengths.push_back(s.length);
  const StepPlan step = plan(lengths);
  predict(step, lengths, hdp_rank, batch);
  batch.micro_batches = local_micro_batches(dataset, batch.sequences, step, hdp_rank);
  return batch;
}

}  // namespace hdp
