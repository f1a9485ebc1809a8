#pragma once
// The optimizer's settings: AdamW's hyper-parameters, the learning-rate schedule and
// gradient clipping. Plain data, like model_config.h. The one definition of each:
// the config file's optim section fills them, ZeRO-1 (parallel/zero_optimizer.h)
// takes the AdamW hyper-parameters and hands them to the AdamW kernel, the trainer
// reads the schedule (model/lr_schedule.h) and the clipping threshold.

#include <cstdint>

#include "base/enum_names.h"

namespace hdp {

// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), under
// torch.optim.AdamW's names.
struct AdamWHyperparameters {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // of the parameters that decay (matrices; norm weights do not)
};

// optim.schedule: the shape of the learning rate after the warmup
// (model/lr_schedule.h has the formulas).
enum class LrScheduleKind { Cosine, Linear, Wsd, Constant };
inline constexpr EnumName<LrScheduleKind> kLrScheduleNames[] = {
    {LrScheduleKind::Cosine, "cosine", "half a cosine from lr down to min_lr over the decay"},
    {LrScheduleKind::Linear, "linear", "a straight line from lr down to min_lr over the decay"},
    {LrScheduleKind::Wsd, "wsd", "warmup-stable-decay: lr until the last part of the run, then linear to min_lr"},
    {LrScheduleKind::Constant, "constant", "lr after the warmup, no decay"}};

// Linear warmup from 0 to lr over warmup_steps, then the schedule's decay to
// min_lr. The decay's length: decay_steps when above 0; else, for cosine and
// linear, every step after the warmup up to train.steps, and for wsd
// decay_fraction of train.steps, ending at train.steps.
struct LearningRateSchedule {
  LrScheduleKind kind = LrScheduleKind::Cosine;
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 10;
  int64_t decay_steps = 0;
  double decay_fraction = 0.1;
};

// The config file's optim section, whose keys are the members of both (optim.lr,
// optim.beta1, ...) and the clipping threshold: it is each of them, so a caller
// hands config.optim to whatever takes one.
struct OptimConfig : LearningRateSchedule, AdamWHyperparameters {
  double grad_clip = 1.0;  // the most global gradient norm; 0 disables clipping
};

}  // namespace hdp
