#include "model/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace hdp {

double learning_rate(const LearningRateSchedule& schedule, int64_t step, int64_t total_steps) {
  if (schedule.warmup_steps > 0 && step <= schedule.warmup_steps) {
    return schedule.lr * static_cast<double>(step) / static_cast<double>(schedule.warmup_steps);
  }
  const int64_t decay_steps = total_steps - schedule.warmup_steps;
  if (decay_steps <= 0) return schedule.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - schedule.warmup_steps) / static_cast<double>(decay_steps));
  return schedule.min_lr + 0.5 * (schedule.lr - schedule.min_lr) * (1.0 + std::cos(M_PI * progress));
}

float clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (grad_norm + 1e-6));
}

}  // namespace hdp
