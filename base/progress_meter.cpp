#include "base/progress_meter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hdp {

std::string format_duration(double seconds) {
  const long long s = std::llround(std::max(0.0, seconds));
  char text[48];
  if (s < 60) {
    std::snprintf(text, sizeof text, "%lld s", s);
  } else if (s < 3600) {
    std::snprintf(text, sizeof text, "%lld min %02lld s", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld h %02lld min", s / 3600, s / 60 % 60);
  }
  return text;
}

ProgressMeter::ProgressMeter(double interval_s) : interval_s_(interval_s) {}

bool ProgressMeter::due() {
  const Clock::time_point now = Clock::now();
  if (std::chrono::duration<double>(now - last_).count() < interval_s_) return false;
  last_ = now;
  return true;
}

double ProgressMeter::elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

double ProgressMeter::left_s(double fraction) const {
  if (fraction <= 0) return 0;
  return elapsed_s() * (1 - std::min(fraction, 1.0)) / fraction;
}

std::string ProgressMeter::elapsed_and_left(double fraction) const {
  return format_duration(elapsed_s()) + " elapsed, ETA " + (fraction > 0 ? format_duration(left_s(fraction)) : "?");
}

}  // namespace hdp
