#pragma once
// How a run's layers are split over its pipeline stages, which the config's
// checks (train.recompute_layers), the engine (the stage this rank builds) and the
// step planner (the memory a micro-batch may use) read from the config.

#include <cstdint>
#include <vector>

#include "config/config.h"

namespace hdp {

// Layers per pipeline stage: parallel.pp_layers when given, otherwise the split
// that balances the stages' FLOPs at data.max_seq_len (planning/stage_split.h).
std::vector<int64_t> pipeline_layers(const Config& config);
// The smallest stage's layers: what the planner budgets memory for per stage, and
// the most train.recompute_layers may ask of every stage.
int64_t smallest_stage_layers(const Config& config);

}  // namespace hdp
