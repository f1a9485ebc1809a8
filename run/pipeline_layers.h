#pragma once
// How a run's layers are split over its pipeline stages, which both the engine
// (the stage this rank builds) and the step planner (the memory a micro-batch
// may use) read from the config.

#include <cstdint>
#include <vector>

#include "config/config.h"

namespace hdp {

// Layers per pipeline stage: parallel.pp_layers when given, otherwise the split
// that balances the stages' FLOPs at data.max_seq_len (planning/stage_split.h).
std::vector<int64_t> pipeline_layers(const Config& config);
// The layers per stage the planner budgets memory for: the smallest stage's.
int64_t planner_layers(const Config& config);

}  // namespace hdp
