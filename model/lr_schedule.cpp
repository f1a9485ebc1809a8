#include "model/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace hdp {

LrDecay lr_decay(const LearningRateSchedule& schedule, int64_t total_steps) {
  const int64_t warmup = schedule.warmup_steps;
  switch (schedule.kind) {
    case LrScheduleKind::Constant:
      return {warmup, 0};
    case LrScheduleKind::Wsd: {
      const int64_t length = schedule.decay_steps > 0
                                 ? schedule.decay_steps
                                 : std::llround(schedule.decay_fraction * static_cast<double>(total_steps));
      const int64_t start = std::max(warmup, total_steps - length);
      return {start, std::max<int64_t>(0, total_steps - start)};
    }
    case LrScheduleKind::Cosine:
    case LrScheduleKind::Linear:
      break;
  }
  const int64_t length = schedule.decay_steps > 0 ? schedule.decay_steps : total_steps - warmup;
  return {warmup, std::max<int64_t>(0, length)};
}

double learning_rate(const LearningRateSchedule& schedule, int64_t step, int64_t total_steps) {
  if (schedule.warmup_steps > 0 && step <= schedule.warmup_steps) {
    return schedule.lr * static_cast<double>(step) / static_cast<double>(schedule.warmup_steps);
  }
  const LrDecay decay = lr_decay(schedule, total_steps);
  if (decay.length <= 0 || step <= decay.start) return schedule.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - decay.start) / static_cast<double>(decay.length));
  if (schedule.kind == LrScheduleKind::Cosine)
    return schedule.min_lr + 0.5 * (schedule.lr - schedule.min_lr) * (1.0 + std::cos(M_PI * progress));
  return schedule.min_lr + (schedule.lr - schedule.min_lr) * (1.0 - progress);
}

bool schedule_continues(const RunSchedule& before, const RunSchedule& now, int64_t step) {
  const double a = learning_rate(before, step + 1), b = learning_rate(now, step + 1);
  return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

float clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (grad_norm + 1e-6));
}

}  // namespace hdp
