#include "run/step_planner.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "data/materialize.h"
#include "kernels/dtype.h"
#include "planning/step_bound.h"
#include "config/pipeline_layers.h"
#include "run/planner_cost.h"
#include "run/step_costs.h"
#include "whatif/step_measure.h"

namespace hdp {

StepPlanner::StepPlanner(const Config& config, const CostModel& cost)
    : policy_(config.scheduler.policy), cp_(static_cast<int>(config.scheduler.cp)), chunks_(config.parallel.vpp) {
  stage_layers_ = pipeline_layers(config);
  // Under expert parallelism every MoE layer's all-to-alls block it as its compute
  // does (a per-token term of the layer), and the ranks of an ep group run their
  // micro-batches in lock step.
  CostModel layer = cost;
  layer.b1 += expert_all_to_all_seconds_per_token(config, cost);
  const ModelShape shape = config.model.shape();
  const double rate = implied_flops_per_second(cost, shape, config.parallel.tp);
  settings_ = memory_planner_settings(config, layer, rate);
  // The rerun of the stage's recomputed layers (train.recompute on the first
  // train.recompute_layers of each of its model chunks, all by default), at the rate
  // the layer's cost implies and as a share of a stage's layers, which the planners
  // multiply by them: a micro-batch is predicted to take l T(s) + k R(s) per stage.
  // The prediction takes the smallest stage's share (its memory budget is the
  // planners'); the lower bound the least share of any stage, so that l_s times it
  // never exceeds what stage s reruns (planning/step_bound.h).
  CostModel bound_cost = settings_.cost;
  if (config.train.recompute != RecomputeMode::None && !config.train.recompute_per_micro_batch && rate > 0) {
    const std::vector<int64_t> recomputed = recomputed_layers_per_stage(config);
    const size_t smallest = static_cast<size_t>(
        std::min_element(stage_layers_.begin(), stage_layers_.end()) - stage_layers_.begin());
    double least = 1;
    for (size_t s = 0; s < recomputed.size(); ++s)
      least = std::min(least, static_cast<double>(recomputed[s]) / static_cast<double>(stage_layers_[s]));
    price_recomputation(settings_.cost, shape, config.parallel.tp, config.train.recompute, rate,
                        static_cast<double>(recomputed[smallest]) / static_cast<double>(stage_layers_[smallest]));
    price_recomputation(bound_cost, shape, config.parallel.tp, config.train.recompute, rate, least);
  }
  settings_.ep = config.parallel.ep;
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
  bound_settings_ = settings_;
  bound_settings_.cost = bound_cost;
  // The simulator runs the all-to-alls as transfers of their own: its layer is the
  // planners' without them.
  CostModel simulated = settings_.cost;
  simulated.b1 = cost.b1;
  step_costs_ = run_step_costs(config, simulated, settings_.recompute.recomputed);
  simulate_candidates_ = policy_ == SchedulerPolicy::Balance && config.parallel.pp > 1;
}

StepPlan StepPlanner::plan(std::span<const int64_t> lengths) const {
  BalanceSettings balance = balance_;
  if (simulate_candidates_) balance.step_seconds = simulated_step_measure(lengths, step_costs_);
  StepPlan plan = policy_ == SchedulerPolicy::Static    ? plan_static(lengths, settings_, cp_)
                  : policy_ == SchedulerPolicy::Balance ? plan_balance(lengths, settings_, balance)
                                                        : plan_naive(lengths, settings_);
  check_plan(plan, lengths, settings_.layers_per_stage, settings_.pipeline_stages, chunks_);
  return plan;
}

PlannerSettings memory_planner_settings(const Config& config, const CostModel& layer, double flops_per_second) {
  PlannerSettings st;
  st.hdp = config.parallel.hdp;
  st.capacity = config.data.micro_batch_tokens;
  st.layers_per_stage = smallest_stage_layers(config);
  st.pipeline_stages = config.parallel.pp;
  st.cost = layer;
  st.offload.enabled = config.offload.enabled;
  st.offload.forced_ratio = config.offload.ratio;
  if (may_plan_recompute(config)) {
    RecomputeOption& r = st.recompute;
    r.max_layers = most_planned_recompute_layers(config);
    r.recomputed = layer;
    const double share = recomputed_bytes_share(config);
    r.recomputed.a2 *= share;
    r.recomputed.b2 *= share;
    if (flops_per_second > 0) {
      price_recomputation(r.recomputed, config.model.shape(), config.parallel.tp, config.train.recompute,
                          flops_per_second);
    }
  }
  return st;
}

int64_t most_planned_recompute_layers(const Config& config) {
  if (!may_plan_recompute(config)) return 0;
  const std::vector<int64_t> recomputed = recomputed_layers_per_stage(config);
  return *std::min_element(recomputed.begin(), recomputed.end());
}

double recomputed_bytes_share(const Config& config) {
  const ModelShape shape = config.model.shape();
  const int tp = config.parallel.tp, bytes = static_cast<int>(dtype_size(config.train.precision));
  const bool sp = config.parallel.sequence_parallel, rings = config.parallel.hdp > 1;
  return saved_bytes_per_token(shape, tp, bytes, config.train.recompute, rings, sp) /
         saved_bytes_per_token(shape, tp, bytes, RecomputeMode::None, false, sp);
}

SamplerOptions sampler_options(const DataConfig& data) {
  SamplerOptions o;
  o.max_seq_len = data.max_seq_len;
  o.global_batch_tokens = data.global_batch_tokens;
  o.shuffle = data.shuffle;
  o.seed = data.seed;
  return o;
}

StepPrediction StepPlanner::predict(const StepPlan& plan, std::span<const int64_t> lengths) const {
  StepPrediction p;
  p.busy_s = predicted_rank_seconds(plan, lengths, settings_);
  p.bound_s = step_lower_bound(lengths, bound_settings_, stage_layers_).seconds();
  p.step_s = simulated_step_seconds(plan, lengths, step_costs_);
  return p;
}

void StepPrediction::fill(int hdp_rank, GlobalBatch& batch) const {
  batch.planned_busy_s = busy_s[hdp_rank];
  batch.planned_max_busy_s = *std::max_element(busy_s.begin(), busy_s.end());
  batch.planned_bound_s = bound_s;
  batch.planned_step_s = step_s;
}

void StepPlanner::predict(const StepPlan& plan, std::span<const int64_t> lengths, int hdp_rank,
                          GlobalBatch& batch) const {
  predict(plan, lengths).fill(hdp_rank, batch);
}

GlobalBatch StepPlanner::next_local_batch(BatchSampler& sampler, const TokenDataset& dataset, int hdp_rank) const {
  GlobalBatch batch = sampler.next();
  const std::vector<int64_t> lengths = sequence_lengths(batch.sequences);
  const StepPlan step = plan(lengths);
  predict(step, lengths, hdp_rank, batch);
  batch.local_micro_batches =
      materialize_rank_work(dataset_reader(dataset), batch.sequences, rank_work(step, lengths, hdp_rank));
  return batch;
}

}  // namespace hdp
