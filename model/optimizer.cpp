#include "model/optimizer.h"

#include <algorithm>
#include <cmath>


namespace hdp {

double learning_rate(const LearningRateSchedule& schedule, int64_t step, int64_t total_steps) {
  if (schedule.warmup_steps > 0 && step <= schedule.warmup_steps) {
    return schedule.lr * static_cast<double>(step) / static_cast<double>(schedule.warmup_steps);
  }
  const int64_t decay_steps = total_steps - schedule.warmup_steps;
  if (decay_steps <= 0) return schedule.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - schedule.warmup_steps) / static_cast<double>(decay_steps));
  return schedule.min_lr + 0.5 * (schedule.lr - schedule.min_lr) * (1.0 + std::cos(M_PI * progress));
}

float clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (grad_norm + 1e-6));
}

std::vector<FlatParameter> flat_parameters(const LlamaModel& model) {
  std::vector<FlatParameter> out;
  const bool tp_primary = model.partition().tp_rank == 0;
  for (const ParameterInfo& p : model.parameters()) {
    FlatParameter f;
    f.offset = p.offset;
    f.numel = p.numel;
    f.weight_decay = p.weight_decay;
    f.counts_in_norm = !p.tied_copy && (p.shard_dim >= 0 || tp_primary);
    f.expert = p.expert && model.partition().ep_size > 1;  // otherwise their group is hdp, like the rest
    f.synced_later = model.config().tie_embeddings && p.name == "model.embed_tokens.weight" &&
                     !(model.partition().has_embedding && model.partition().has_head);
    out.push_back(f);
  }
  return out;
}

}  // namespace hdp
