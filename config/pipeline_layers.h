#pragma once
// How a run's layers are split over its pipeline stages, which the config's
// checks (train.recompute_layers), the engine (the stage this rank builds) and the
// step planner (the memory a micro-batch may use) read from the config.

#include <cstdint>
#include <vector>

#include "config/config.h"

namespace hdp {

// Layers per virtual stage (interleaved 1F1B, parallel.vpp; pp x vpp entries,
// chunk c of stage s being virtual stage c x pp + s): parallel.pp_layers when given
// (vpp 1), otherwise the split that balances the virtual stages' FLOPs at
// data.max_seq_len (planning/stage_split.h).
std::vector<int64_t> virtual_stage_layers(const Config& config);
// Layers per pipeline stage: the sum of its virtual stages' (with vpp 1, the same).
std::vector<int64_t> pipeline_layers(const Config& config);
// The smallest stage's layers: what the planner budgets memory for per stage, and
// the most train.recompute_layers may ask of every stage.
int64_t smallest_stage_layers(const Config& config);
// Per pipeline stage, the layers that recompute: train.recompute_layers counts from
// each of its model chunks' first layer (all of them when unset); 0 under
// train.recompute none.
std::vector<int64_t> recomputed_layers_per_stage(const Config& config);

}  // namespace hdp
