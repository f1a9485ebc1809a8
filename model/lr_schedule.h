#pragma once
// What the trainer does to the update between optimizer steps: the learning rate of
// a step, and the factor that clips the gradients. The settings are
// spec/optim_config.h's; the AdamW update itself, sharded ZeRO-1 style across the
// hybrid-data-parallel ranks, is parallel/zero_optimizer.h.

#include <cstdint>

#include "spec/optim_config.h"

namespace hdp {

// Linear warmup from 0 to lr over warmup_steps, then cosine decay to min_lr at total_steps.
// `step` is 1-based (the step about to be taken).
double learning_rate(const LearningRateSchedule& schedule, int64_t step, int64_t total_steps);

// The factor gradients are multiplied by so their global norm is at most max_norm
// (1 when max_norm is 0 or the norm is already small enough).
float clip_factor(double grad_norm, double max_norm);

}  // namespace hdp
