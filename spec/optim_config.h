#pragma once
// The optimizer's settings: AdamW's hyper-parameters, the learning-rate schedule and
// gradient clipping. Plain data, like model_config.h. The one definition of each:
// the config file's optim section fills them, ZeRO-1 (parallel/zero_optimizer.h)
// takes the AdamW hyper-parameters and hands them to the AdamW kernel, the trainer
// reads the schedule (model/lr_schedule.h) and the clipping threshold.

#include <cstdint>

namespace hdp {

// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), under
// torch.optim.AdamW's names.
struct AdamWHyperparameters {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // of the parameters that decay (matrices; norm weights do not)
};

// Linear warmup from 0 to lr over warmup_steps, then cosine decay to min_lr at the
// last step.
struct LearningRateSchedule {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 10;
};

// The config file's optim section, whose keys are the members of both (optim.lr,
// optim.beta1, ...) and the clipping threshold: it is each of them, so a caller
// hands config.optim to whatever takes one.
struct OptimConfig : LearningRateSchedule, AdamWHyperparameters {
  double grad_clip = 1.0;  // the most global gradient norm; 0 disables clipping
};

}  // namespace hdp
