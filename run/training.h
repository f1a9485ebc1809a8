#pragma once
// `trainer train` on one rank: a loader rank serves data (run/loader_roles.h); a
// training rank sets up its job (run/job.h), its batch source (run/batch_source.h)
// and runs the training loop (run/training_loop.h): data in, steps, metrics and
// checkpoints out.

#include "parallel/runtime.h"
#include "config/config.h"

namespace hdp {

// Trains as the config says. Throws on failure (ConfigError, DatasetError,
// CheckpointError for bad inputs; anything else for internal failures).
void run_training(const Config& config, const ProcessInfo& process);

}  // namespace hdp
