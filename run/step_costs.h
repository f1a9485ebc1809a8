#pragma once
// The step simulator's costs (whatif/step_simulation.h) of a training run, so that
// the step planner (run/step_planner.h) can compare its balance candidates by the
// simulated step, as `trainer plan` does, and record the simulated step of the plan
// it runs. What `trainer plan` derives from a cluster file the run takes from what it
// knows: make_step_costs for the run's model, layout (parallel.*, the virtual stages'
// layers of config/pipeline_layers.h), train.recompute and sequence parallelism sets
// the byte counts and the schedule's structure, and the run's own cost model (the
// planners', run/planner_cost.h) replaces its layer, embedding and head times.
//
// Links. Transfers (ring attention's key/value rows, pipeline sends, expert
// all-to-alls, ZeRO-1's gradient reduce-scatter and parameter all-gather) and the
// optimizer's memory traffic run at the cost model's copy bandwidth, min(d2h, h2d),
// with no per-message latency: the only rate the run knows (offload.bandwidth_gbs, or
// the profiler's measured host copy), which is what the CPU backend's ranks of a node
// move bytes at (MPI's shared memory is such a copy), as
// expert_all_to_all_seconds_per_token (run/planner_cost.h) takes it too. Consequences:
// latency is not charged, so many small messages (ring steps of short chunks, ranks
// oversubscribing their cores) take longer than predicted; on GPUs NVLink and the
// network are faster than a PCIe copy, so there transfers that do not hide under
// compute are overcharged and the simulated step is pessimistic. Bytes are counted
// in train.precision's element size (the simulator's cluster model counts bf16).

#include "config/config.h"
#include "planning/cost_model.h"
#include "whatif/step_simulation.h"

namespace hdp {

// layer: one layer's time and saved bytes as the planners price it, recomputation
// included but not the expert all-to-alls (the simulator runs those as transfers);
// its embedding and head seconds per token are the run's. recomputed: the rerun of
// a micro-batch's recomputed layers under planned recomputation
// (RecomputeOption::recomputed; StepCosts::recomputed). Throws ConfigError when the
// copy bandwidth is not positive.
StepCosts run_step_costs(const Config& config, const CostModel& layer, const CostModel& recomputed);

}  // namespace hdp
