#include "run/numerical_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hdp {
namespace {

// value > factor x median: a spike, once there is a median (factor 0: never).
bool above(double value, double factor, double median, size_t history) {
  return factor > 0 && history > 0 && value > factor * median;
}

}  // namespace

NumericalGuard::NumericalGuard(SpikeFactors factors, int64_t max_bad_steps)
    : factors_(factors), max_bad_steps_(max_bad_steps) {
  for (double f : {factors.loss, factors.grad_norm})
    if (f != 0 && !(f > 1)) throw std::invalid_argument("NumericalGuard: a spike factor must be 0 or > 1");
  if (max_bad_steps < 1) throw std::invalid_argument("NumericalGuard: max_bad_steps must be >= 1");
}

StepFault NumericalGuard::inspect(double loss, double grad_norm) const {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return StepFault::NonFinite;
  if (above(loss, factors_.loss, losses_.median(), losses_.size())) return StepFault::LossSpike;
  if (above(grad_norm, factors_.grad_norm, grad_norms_.median(), grad_norms_.size())) return StepFault::GradNormSpike;
  return StepFault::None;
}

bool NumericalGuard::record(StepFault fault, double loss, double grad_norm) {
  if (fault == StepFault::None) {
    bad_in_a_row_ = 0;
    losses_.add(loss);
    grad_norms_.add(grad_norm);
    return false;
  }
  return ++bad_in_a_row_ >= max_bad_steps_;
}

void NumericalGuard::restore_windows(const std::vector<double>& losses, const std::vector<double>& grad_norms) {
  losses_.restore(losses);
  grad_norms_.restore(grad_norms);
}

std::string NumericalGuard::describe(StepFault fault, double loss, double grad_norm) const {
  char text[200];
  switch (fault) {
    case StepFault::None:
      return "no fault";
    case StepFault::NonFinite:
      std::snprintf(text, sizeof(text), "loss %g, gradient norm %g: not finite", loss, grad_norm);
      return text;
    case StepFault::LossSpike:
      std::snprintf(text, sizeof(text), "loss %g is above train.spike_factor %g x the median %g of the recent good steps",
                    loss, factors_.loss, losses_.median());
      return text;
    case StepFault::GradNormSpike:
      std::snprintf(text, sizeof(text),
                    "gradient norm %g is above train.grad_norm_spike_factor %g x the median %g of the recent good steps",
                    grad_norm, factors_.grad_norm, grad_norms_.median());
      return text;
  }
  return "unknown fault";
}

void NumericalGuard::Window::add(double value) { recent_[recorded_++ % kWindow] = value; }

void NumericalGuard::Window::restore(const std::vector<double>& values) {
  recorded_ = 0;
  const size_t first = values.size() > kWindow ? values.size() - kWindow : 0;
  for (size_t i = first; i < values.size(); ++i) add(values[i]);
}

std::vector<double> NumericalGuard::Window::values() const {
  const size_t n = size();
  std::vector<double> out;
  out.reserve(n);
  for (size_t i = recorded_ - n; i < recorded_; ++i) out.push_back(recent_[i % kWindow]);
  return out;
}

double NumericalGuard::Window::median() const {
  const size_t n = size();
  if (n == 0) return 0;
  std::copy(recent_.begin(), recent_.begin() + static_cast<long>(n), sorted_.begin());
  std::sort(sorted_.begin(), sorted_.begin() + static_cast<long>(n));
  return n % 2 == 1 ? sorted_[n / 2] : (sorted_[n / 2 - 1] + sorted_[n / 2]) / 2;
}

}  // namespace hdp
