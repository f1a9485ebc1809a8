#pragma once
// Offload and recomputation as alternatives per layer, for a micro-batch above the
// capacity: ByteScale's selective offload ratio (Ge et al., 2025, the communication
// optimizer's selective offloading) extended by Megatron's activation recomputation
// (Korthikanti et al., 2022). The stage's first k layers recompute (they keep only
// part of what they save and rerun the rest of their forward in backward: time on
// the critical path); a share r of the saved rows of the others but the last two goes
// to host memory (copies beside the compute, which cost only the part that does not
// hide behind it). Recomputed layers save fewer bytes, so fewer rows need to leave
// the device. The memory model is max_micro_batch_tokens's (planning/plan.h).

#include <cstdint>
#include <optional>

#include "planning/cost_model.h"

namespace hdp {

// The recomputation a micro-batch may add.
struct RecomputeOption {
  int64_t max_layers = 0;  // the most of a stage's layers that may recompute (its first ones); 0: none
  // A recomputed layer under the mode it would run: a2 and b2 what it keeps per token
  // (Act's terms), recompute_seconds what its backward reruns.
  CostModel recomputed;
};

struct ActivationMixSettings {
  int64_t capacity = 0;  // C: tokens per micro-batch with every layer whole and nothing offloaded
  int64_t layers = 1;    // l: the stage's layers
  CostModel cost;        // a whole layer: Act(s) and the copy rates
  RecomputeOption recompute;
  bool offload = true;
  double host_bytes = 0;                // the most one micro-batch may offload; 0: unlimited
  double forward_fraction = 1.0 / 3.0;  // forward's share of a layer's compute (backward: the rest)
};

struct ActivationMix {
  int64_t recompute_layers = 0;  // k
  double offload_ratio = 0;      // r, of the layers [k, l - 2)
  double seconds = 0;            // what it adds to the micro-batch's time on the stage
};

// recomputed.a2 / cost.a2: the share of a whole layer's bytes per token that a
// recomputed layer keeps (max_micro_batch_tokens's rho); 1 without recomputation.
double recomputed_layer_share(const ActivationMixSettings& settings);

// The seconds mix (k, r) adds to a micro-batch of `tokens` tokens whose layers each
// compute for layer_seconds (forward and backward; a ring member's share of its
// ring): k R (CostModel::recompute_seconds of the recomputed layer, a ring member's
// for `ring`), plus for each of the m = max(0, l - k - 2) offloaded layers the copy
// out beyond the layer's forward and the copy back beyond its backward,
//   m (max(0, r Act(t) / B_d2h - f layer_seconds) + max(0, r Act(t) / B_h2d - (1 - f) layer_seconds)),
// f = forward_fraction. Infinite when it copies without a copy rate.
double activation_mix_seconds(int64_t tokens, bool ring, double layer_seconds, const ActivationMix& mix,
                              const ActivationMixSettings& settings);
// Its copy terms alone: the m offloaded layers' copies beyond the compute they run
// beside (the rerun is the planners' rerun_seconds).
double activation_copy_seconds(int64_t tokens, double layer_seconds, const ActivationMix& mix,
                               const ActivationMixSettings& settings);

// The mix that fits `tokens` into the device memory (max_micro_batch_tokens) with
// the fewest added seconds (activation_mix_seconds; ties: fewer recomputed layers):
// for each k in [0, min(max_layers, l)] the smallest ratio that fits (larger ones only
// copy more), 0 without offload, within host_bytes (m r Act(t)). {0, 0, 0} when the
// tokens fit the capacity; nothing when no mix fits.
std::optional<ActivationMix> choose_activation_mix(int64_t tokens, bool ring, double layer_seconds,
                                                   const ActivationMixSettings& settings);

// The most tokens any mix fits into the device memory, at least the capacity:
// max_micro_batch_tokens at r = 1 (0 without offload) for k in [0, min(max_layers, l)]
// at recomputed_layer_share. No micro-batch choose_activation_mix admits holds more:
// the planners' bound on a ring's size, and the engine's activation memory.
int64_t largest_mix_tokens(const ActivationMixSettings& settings);

}  // namespace hdp
