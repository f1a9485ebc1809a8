#pragma once
// The optimizer's settings: AdamW and the learning-rate schedule (model/optimizer.h).
// Plain data, like model_config.h.

#include <cstdint>

namespace hdp {

struct OptimConfig {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;                // 0 disables clipping
};

}  // namespace hdp
