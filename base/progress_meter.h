#pragma once
// How far long work is, for its progress lines: elapsed time, the time left at the
// rate so far, and a clock that says when the next line is due (at least every
// 10 s by default), so that no long command is silent for minutes.

#include <chrono>
#include <string>

namespace hdp {

// A duration as a progress line says it: "8 s", "2 min 05 s", "3 h 07 min".
std::string format_duration(double seconds);

class ProgressMeter {
 public:
  explicit ProgressMeter(double interval_s = 10);

  // True when interval_s have passed since the start or since due() last said so.
  bool due();
  double elapsed_s() const;
  // The time left once `fraction` (0..1] of the work is done, at the rate so far; 0
  // before anything is done.
  double left_s(double fraction) const;
  // "E elapsed, ETA L" for `fraction` done.
  std::string elapsed_and_left(double fraction) const;

 private:
  using Clock = std::chrono::steady_clock;
  double interval_s_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_ = start_;
};

}  // namespace hdp
