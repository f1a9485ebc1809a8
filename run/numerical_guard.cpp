#include "run/numerical_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace hdp {

NumericalGuard::NumericalGuard(double spike_factor, int64_t max_bad_steps)
    : spike_factor_(spike_factor), max_bad_steps_(max_bad_steps) {
  if (spike_factor != 0 && !(spike_factor > 1)) throw std::invalid_argument("NumericalGuard: spike_factor must be 0 or > 1");
  if (max_bad_steps < 1) throw std::invalid_argument("NumericalGuard: max_bad_steps must be >= 1");
}

StepFault NumericalGuard::inspect(double loss, double grad_norm) const {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return StepFault::NonFinite;
  if (spike_factor_ > 0 && recorded_ >= kMinHistory && loss > spike_factor_ * median()) return StepFault::Spike;
  return StepFault::None;
}

bool NumericalGuard::record(StepFault fault, double loss) {
  if (fault == StepFault::None) {
    bad_in_a_row_ = 0;
    recent_[recorded_ % kWindow] = loss;
    ++recorded_;
    return false;
  }
  return ++bad_in_a_row_ >= max_bad_steps_;
}

std::vector<double> NumericalGuard::window() const {
  const size_t n = std::min(recorded_, kWindow);
  std::vector<double> out;
  out.reserve(n);
  for (size_t i = recorded_ - n; i < recorded_; ++i) out.push_back(recent_[i % kWindow]);
  return out;
}

void NumericalGuard::restore_window(const std::vector<double>& losses) {
  recorded_ = 0;
  const size_t first = losses.size() > kWindow ? losses.size() - kWindow : 0;
  for (size_t i = first; i < losses.size(); ++i) recent_[recorded_++ % kWindow] = losses[i];
}

double NumericalGuard::median() const {
  const size_t n = std::min(recorded_, kWindow);
  if (n == 0) return 0;
  std::copy(recent_.begin(), recent_.begin() + static_cast<long>(n), sorted_.begin());
  std::sort(sorted_.begin(), sorted_.begin() + static_cast<long>(n));
  return n % 2 == 1 ? sorted_[n / 2] : (sorted_[n / 2 - 1] + sorted_[n / 2]) / 2;
}

std::string describe_fault(StepFault fault, double loss, double grad_norm, double spike_factor, double median) {
  char text[160];
  switch (fault) {
    case StepFault::None:
      return "no fault";
    case StepFault::NonFinite:
      std::snprintf(text, sizeof(text), "loss %g, gradient norm %g: not finite", loss, grad_norm);
      return text;
    case StepFault::Spike:
      std::snprintf(text, sizeof(text), "loss %g is above train.spike_factor %g x the median %g of the recent good steps",
                    loss, spike_factor, median);
      return text;
  }
  return "unknown fault";
}

}  // namespace hdp
