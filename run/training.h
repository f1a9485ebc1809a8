#pragma once
// The training loop of `trainer train`: data in, steps, metrics and checkpoints out.

#include "parallel/runtime.h"
#include "config/config.h"

namespace hdp {

// Trains as the config says. Throws on failure (ConfigError, DatasetError,
// CheckpointError for bad inputs; anything else for internal failures).
void run_training(const Config& config, const ProcessInfo& process);

}  // namespace hdp
