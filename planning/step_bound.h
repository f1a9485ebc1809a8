#pragma once
// The step time no plan of a global batch can beat on a layout, under the cost
// model its plans are priced with (planning/cost_model.h) and the way the step
// simulator (whatif/step_simulation.h) and the trainer run a plan: every sequence
// is one whole local piece or the zig-zag chunks of one ring (planning/plan.h); a
// rank's stage runs its micro-batches one after another; a ring runs in lock step
// for its slowest member's time; a micro-batch passes the stages forward, then
// back; an offloaded micro-batch's copies run beside it and what follows waits for
// them. `trainer plan` prints each policy's simulated step over it ("x.xx of
// bound"); the trainer records it from its own costs beside the measured step
// (metrics.jsonl, planned_bound_ms). docs/planning.md derives it.

#include <algorithm>
#include <cstdint>
#include <span>

#include "planning/hdp_planner.h"

namespace hdp {

// With T(s) = a1 attention_term(s) + b1 s + g a layer's forward and backward over
// s tokens (plus R_ring(s) = rb_ring s when its layers recompute: the least any
// placement reruns, CostModel::recompute_seconds; the caller prices it at the least
// share of its layers any stage recomputes, so l_s R_ring never exceeds stage s's
// rerun), l_s the layers of stage s, e_s
// its seconds per token outside the layers (the embedding on the first stage, the
// head on the last), N the batch's tokens, L its longest sequence, H = hdp and
// tail_s what stage s runs after its last backward:
struct StepBound {
  // max over s of (l_s sum_i T(s_i) + e_s N) / H + tail_s. Each stage runs every
  // sequence's layers once over its H ranks (a ring member computes 1/k of the
  // ring's attention and its own tokens), so its busiest rank holds at least the
  // mean, and the stage's gradient synchronisation waits for that rank.
  double work = 0;
  // sum over s of l_s (a1 attention_term(L) / H + b1 t + g) + e_s t, plus tail_0,
  // with t = ceil(L / H): the micro-batch holding L passes every stage forward and
  // back (pipeline fill and drain), each time taking its member with the most of
  // L's tokens, at least t of them on the at most H ranks a ring may have.
  double longest = 0;
  // The copies memory forces on that member: a micro-batch of t > C tokens passes
  // check_plan only with an offload ratio r at which max_micro_batch_tokens(C,
  // layers_per_stage, r) >= t, and copies r (l_s - 2) Act(t) bytes to the host and
  // later back, the second after the first: max over s of both copies' seconds plus
  // tail_s. 0 when offload is off, t <= C, or recomputation may replace the copies
  // (settings.recompute.max_layers > 0, planning/activation_mix.h).
  double offload = 0;
  int ranks = 0;              // H
  int64_t member_tokens = 0;  // t
  double seconds() const { return std::max({work, longest, offload}); }
};

// lengths: the global batch's sequences. settings: hdp, capacity, layers_per_stage
// (the memory budget of check_plan), cost (b1 with any per-token all-to-all the
// planners add, the embedding's and head's seconds per token, the copy rates, the
// window), offload.enabled and recompute.max_layers. stage_layers: each pipeline stage's layers
// (settings.pipeline_stages of them). tail_seconds: per stage, what every rank of it
// runs after its last backward (the simulator's gradient synchronisation); empty
// for nothing. Throws std::invalid_argument for a stage count or tail list that does
// not match, or a negative length.
StepBound step_lower_bound(std::span<const int64_t> lengths, const PlannerSettings& settings,
                           std::span<const int64_t> stage_layers, std::span<const double> tail_seconds = {});

}  // namespace hdp
