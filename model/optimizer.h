#pragma once
// The learning-rate schedule and gradient clipping. The AdamW update itself,
// sharded ZeRO-1 style across the hybrid-data-parallel ranks, is
// parallel/zero_optimizer.h.

#include <cstdint>
#include <vector>

#include "parallel/zero_optimizer.h"
#include "spec/optim_config.h"
#include "model/model.h"

namespace hdp {

// Linear warmup from 0 to lr over warmup_steps, then cosine decay to min_lr at total_steps.
// `step` is 1-based (the step about to be taken).
double learning_rate(const LearningRateSchedule& schedule, int64_t step, int64_t total_steps);

// The factor gradients are multiplied by so their global norm is at most max_norm
// (1 when max_norm is 0 or the norm is already small enough).
float clip_factor(double grad_norm, double max_norm);

// The model's parameters as the optimizer sees them, in model.parameters() order
// (ZeroAdamW::Segment::parameter indexes both). Tensor-parallel replicas count in
// the gradient norm on tp rank 0 only, and a tied copy never.
std::vector<FlatParameter> flat_parameters(const LlamaModel& model);

}  // namespace hdp
