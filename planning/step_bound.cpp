#include "planning/step_bound.h"

#include <stdexcept>
#include <string>

namespace hdp {

StepBound step_lower_bound(std::span<const int64_t> lengths, const PlannerSettings& settings,
                           std::span<const int64_t> stage_layers, std::span<const double> tail_seconds) {
  const int pp = static_cast<int>(stage_layers.size());
  if (pp < 1 || pp != settings.pipeline_stages)
    throw std::invalid_argument("step_lower_bound: " + std::to_string(pp) + " stage layer counts for " +
                                std::to_string(settings.pipeline_stages) + " pipeline stages");
  if (!tail_seconds.empty() && static_cast<int>(tail_seconds.size()) != pp)
    throw std::invalid_argument("step_lower_bound: " + std::to_string(tail_seconds.size()) + " tails for " +
                                std::to_string(pp) + " pipeline stages");
  if (settings.hdp < 1 || settings.capacity < 1 || settings.layers_per_stage < 1)
    throw std::invalid_argument("step_lower_bound: hdp, capacity and layers per stage must be at least 1");
  const CostModel& c = settings.cost;
  double layer_seconds = 0;  // one layer over every sequence
  int64_t tokens = 0, longest = 0;
  for (int64_t s : lengths) {
    if (s < 0) throw std::invalid_argument("step_lower_bound: a sequence of " + std::to_string(s) + " tokens");
    if (s == 0) continue;  // no piece, no work
    // Recomputation: at least a ring member's rerun (a local sequence reruns more).
    layer_seconds += c.compute_seconds(s) + c.recompute_seconds(s, true);
    tokens += s;
    longest = std::max(longest, s);
  }
  auto tail = [&](int s) { return tail_seconds.empty() ? 0.0 : tail_seconds[s]; };
  auto per_token = [&](int s) {
    return (s == 0 ? c.embedding_seconds_per_token : 0.0) + (s == pp - 1 ? c.head_seconds_per_token : 0.0);
  };
  const double H = settings.hdp;
  StepBound b;
  b.ranks = settings.hdp;
  for (int s = 0; s < pp; ++s) {
    const double l = static_cast<double>(stage_layers[s]);
    b.work = std::max(b.work, (l * layer_seconds + per_token(s) * static_cast<double>(tokens)) / H + tail(s));
  }
  if (longest == 0) return b;

  // The member of the longest sequence's ring with the most of its tokens. (A ring
  // member also pays g per ring sequence, at least once: g >= 0 in every cost model.)
  const int64_t t = (longest + settings.hdp - 1) / settings.hdp;
  b.member_tokens = t;
  const double member = c.a1 * c.attention_term(longest) / H + c.b1 * static_cast<double>(t) + c.g +
                        c.recompute_seconds(t, true);
  double chain = 0;
  for (int s = 0; s < pp; ++s)
    chain += static_cast<double>(stage_layers[s]) * member + per_token(s) * static_cast<double>(t);
  b.longest = chain + tail(0);

  const int64_t l = settings.layers_per_stage, C = settings.capacity;
  // Recomputation may replace the copies (planning/activation_mix.h): no offload term then.
  if (!settings.offload.enabled || l <= 2 || t <= C || settings.recompute.max_layers > 0) return b;
  // The smallest ratio at which max_micro_batch_tokens admits t tokens, l C (1 + 1e-12)
  // / (2 + (1 - r)(l - 2)) >= t, less 1e-9 for the rounding of either computation.
  const double ld = static_cast<double>(l);
  const double ratio = std::clamp(
      1.0 - (ld * static_cast<double>(C) * (1.0 + 1e-12) / static_cast<double>(t) - 2.0) / (ld - 2.0) - 1e-9, 0.0, 1.0);
  double copy_rate_inverse = 0;  // seconds per byte out and back
  if (c.d2h_bytes_per_s > 0) copy_rate_inverse += 1 / c.d2h_bytes_per_s;
  if (c.h2d_bytes_per_s > 0) copy_rate_inverse += 1 / c.h2d_bytes_per_s;
  for (int s = 0; s < pp; ++s) {
    if (stage_layers[s] <= 2) continue;
    const double bytes = ratio * static_cast<double>(stage_layers[s] - 2) * c.activation_bytes(t);
    b.offload = std::max(b.offload, bytes * copy_rate_inverse + tail(s));
  }
  return b;
}

}  // namespace hdp
