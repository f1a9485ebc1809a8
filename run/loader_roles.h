#pragma once
// The loader ranks of a training job with loader.mode: remote
// (data/remote_loader.h). World ranks [0, T) train; [T, T + loader.servers) are
// loader servers, the first of which also runs the scheduler: the same sampler
// and planner as local mode, a step ahead of training.

#include "data/remote_loader.h"
#include "parallel/message_channel.h"
#include "parallel/runtime.h"
#include "config/config.h"

namespace hdp {

// Runs this loader rank until every training rank has said stop. Throws
// ConfigError / DatasetError for bad input, like the training ranks would.
void run_loader_rank(const Config& config, const ProcessInfo& process, MessageChannel& channel, int training_ranks);

}  // namespace hdp
