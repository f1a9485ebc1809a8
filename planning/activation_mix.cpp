#include "planning/activation_mix.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "planning/plan.h"

namespace hdp {

double recomputed_layer_share(const ActivationMixSettings& s) {
  if (s.recompute.max_layers <= 0 || !(s.cost.a2 > 0)) return 1.0;
  return std::clamp(s.recompute.recomputed.a2 / s.cost.a2, std::numeric_limits<double>::min(), 1.0);
}

namespace {

// The smallest ratio at which k recomputed layers fit `tokens`; > 1 when none does.
double smallest_ratio(int64_t tokens, int64_t k, double share, const ActivationMixSettings& s) {
  auto fits = [&](double r) {
    return tokens <= max_micro_batch_tokens(s.capacity, s.layers, r, k, share);
  };
  if (fits(0.0)) return 0.0;
  const int64_t m = offloaded_layers(s.layers, k);
  if (!s.offload || m == 0 || !fits(1.0)) return 2.0;
  // k rho + h + m (1 - r) <= l C / t, then up to the next representable ratios that fit
  // (the limit floors).
  const double l = static_cast<double>(s.layers), md = static_cast<double>(m);
  const double held = static_cast<double>(k) * share + static_cast<double>(std::min<int64_t>(2, s.layers - k));
  double r = std::clamp(1.0 - (l * static_cast<double>(s.capacity) / static_cast<double>(tokens) - held) / md, 0.0, 1.0);
  for (double step = 1e-12; r < 1.0 && !fits(r); step *= 2) r = std::min(1.0, r + step);
  return r;
}

}  // namespace

double activation_copy_seconds(int64_t tokens, double layer_seconds, const ActivationMix& mix,
                               const ActivationMixSettings& s) {
  const int64_t m = offloaded_layers(s.layers, mix.recompute_layers);
  if (!(mix.offload_ratio > 0) || m <= 0) return 0;
  if (!(s.cost.d2h_bytes_per_s > 0) || !(s.cost.h2d_bytes_per_s > 0)) return std::numeric_limits<double>::infinity();
  const double bytes = mix.offload_ratio * s.cost.activation_bytes(tokens);
  const double f = s.forward_fraction;
  const double out = std::max(0.0, bytes / s.cost.d2h_bytes_per_s - f * layer_seconds);
  const double back = std::max(0.0, bytes / s.cost.h2d_bytes_per_s - (1 - f) * layer_seconds);
  return static_cast<double>(m) * (out + back);
}

double activation_mix_seconds(int64_t tokens, bool ring, double layer_seconds, const ActivationMix& mix,
                              const ActivationMixSettings& s) {
  return static_cast<double>(mix.recompute_layers) * s.recompute.recomputed.recompute_seconds(tokens, ring) +
         activation_copy_seconds(tokens, layer_seconds, mix, s);
}

std::optional<ActivationMix> choose_activation_mix(int64_t tokens, bool ring, double layer_seconds,
                                                   const ActivationMixSettings& s) {
  if (s.capacity < 1 || s.layers < 1 || tokens < 0) {
    throw std::invalid_argument("choose_activation_mix: capacity " + std::to_string(s.capacity) + ", layers " +
                                std::to_string(s.layers) + ", tokens " + std::to_string(tokens));
  }
  if (tokens <= s.capacity) return ActivationMix{};
  const double share = recomputed_layer_share(s);
  const int64_t most = std::clamp<int64_t>(s.recompute.max_layers, 0, s.layers);
  std::optional<ActivationMix> best;
  for (int64_t k = 0; k <= most; ++k) {
    const double r = smallest_ratio(tokens, k, share, s);
    if (r > 1.0) continue;
    const int64_t m = offloaded_layers(s.layers, k);
    if (r > 0 && s.host_bytes > 0 && static_cast<double>(m) * r * s.cost.activation_bytes(tokens) > s.host_bytes)
      continue;
    ActivationMix mix{k, r, 0};
    mix.seconds = activation_mix_seconds(tokens, ring, layer_seconds, mix, s);
    if (!std::isfinite(mix.seconds)) continue;
    if (!best || mix.seconds < best->seconds) best = mix;
  }
  return best;
}

int64_t largest_mix_tokens(const ActivationMixSettings& s) {
  const double share = recomputed_layer_share(s);
  int64_t most = s.capacity;
  for (int64_t k = 0; k <= std::min(s.recompute.max_layers, s.layers); ++k)
    most = std::max(most, max_micro_batch_tokens(s.capacity, s.layers, s.offload ? 1.0 : 0.0, k, share));
  return most;
}

}  // namespace hdp
