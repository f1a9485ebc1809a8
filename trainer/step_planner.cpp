#include "trainer/step_planner.h"

#include <stdexcept>
#include <vector>

#include "parallel/cost_model.h"
#include "trainer/engine.h"

namespace hdp {

StepPlanner::StepPlanner(const Config& config, double flops_per_second, int64_t saved_floats_per_token)
    : policy_(config.scheduler.policy), cp_(static_cast<int>(config.scheduler.cp)) {
  const ModelConfig& m = config.model;
  const int64_t tp = config.parallel.tp;
  LayerShape shape;
  shape.hidden = m.hidden_size;
  shape.heads = m.num_heads / tp;
  shape.kv_heads = m.num_kv_heads / tp;
  shape.head_dim = m.head_dim();
  shape.ffn = m.ffn_hidden_size / tp;
  shape.saved_floats_per_token = saved_floats_per_token;
  settings_.hdp = static_cast<int>(config.parallel.hdp);
  settings_.capacity = config.data.micro_batch_tokens;
  settings_.layers_per_stage = planner_layers(config);
  settings_.pipeline_stages = static_cast<int>(config.parallel.pp);
  settings_.cost = analytic_cost_model(shape, flops_per_second, config.offload.bandwidth_gbs * 1e9);
  settings_.offload.enabled = config.offload.enabled;
  settings_.offload.forced_ratio = config.offload.ratio;
  if (policy_ == "naive") {
    try {
      choose_ranks(config.data.max_seq_len, settings_);
    } catch (const std::invalid_argument& e) {
      throw ConfigError("data.max_seq_len " + std::to_string(config.data.max_seq_len) + ": " + e.what() +
                        "; lower data.max_seq_len, or raise parallel.hdp or data.micro_batch_tokens, or enable offload");
    }
  }
}

StepPlan StepPlanner::plan(std::span<const int64_t> lengths) const {
  StepPlan plan = policy_ == "static" ? plan_static(lengths, settings_, cp_) : plan_naive(lengths, settings_);
  check_plan(plan, lengths, settings_.layers_per_stage, settings_.pipeline_stages);
  return plan;
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

GlobalBatch StepPlanner::next_local_batch(BatchSampler& sampler, const TokenDataset& dataset, int hdp_rank) const {
  GlobalBatch batch = sampler.next_plan();
  std::vector<int64_t> lengths;
  for (const SequenceSpan& s : batch.sequences) lengths.push_back(s.length);
  batch.micro_batches = local_micro_batches(dataset, batch.sequences, plan(lengths), hdp_rank);
  return batch;
}

}  // namespace hdp
