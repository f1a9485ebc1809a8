#pragma once
// What the trainer does to the update between optimizer steps: the learning rate of
// a step, and the factor that clips the gradients. The settings are
// spec/optim_config.h's; the AdamW update itself, sharded ZeRO-1 style across the
// hybrid-data-parallel ranks, is parallel/zero_optimizer.h.

#include <cstdint>

#include "spec/optim_config.h"

namespace hdp {

// The steps over which the rate falls from lr to min_lr: lr at step `start`,
// min_lr from step start + length on. length 0: no decay.
struct LrDecay {
  int64_t start = 0;
  int64_t length = 0;
};

// The decay of `schedule` in a run of `total_steps` steps (the config's
// train.steps): cosine and linear start after the warmup and last decay_steps
// (0: up to the last step); wsd ends at the last step and lasts decay_steps (0:
// decay_fraction of the steps), never starting inside the warmup; constant has none.
LrDecay lr_decay(const LearningRateSchedule& schedule, int64_t total_steps);

// The learning rate of `step` (1-based: the step about to be taken): linear warmup
// from 0 to lr over warmup_steps, then lr until the decay (lr_decay), along it the
// schedule's curve down to min_lr, and min_lr after it.
//   cosine   min_lr + (lr - min_lr) (1 + cos(pi p)) / 2   (Loshchilov & Hutter 2017, SGDR)
//   linear   min_lr + (lr - min_lr) (1 - p)
//   wsd      as linear, over the last part of the run only: warmup-stable-decay
//            (MiniCPM, Hu et al. 2024; Hägele et al. 2024 show the linear cooldown
//            matching cosine), so that a run can be extended while it is stable
//   constant lr
// where p is the fraction of the decay done at `step`.
double learning_rate(const LearningRateSchedule& schedule, int64_t step, int64_t total_steps);

// A run's schedule: its settings and its train.steps, which the default decay
// length follows. Checkpoints record it (checkpoint/manifest.h) so that a resumed
// run can tell whether its own schedule continues the one it resumes.
struct RunSchedule {
  LearningRateSchedule schedule;
  int64_t steps = 0;
};
inline double learning_rate(const RunSchedule& run, int64_t step) {
  return learning_rate(run.schedule, step, run.steps);
}

// Whether a run resumed after `step` under `now` starts where `before` would have
// gone on: the same learning rate for step + 1, to a part in 10^9. A changed
// schedule may still continue (wsd extended while stable, a cosine still warming up).
bool schedule_continues(const RunSchedule& before, const RunSchedule& now, int64_t step);

// The factor gradients are multiplied by so their global norm is at most max_norm
// (1 when max_norm is 0 or the norm is already small enough).
float clip_factor(double grad_norm, double max_norm);

}  // namespace hdp
