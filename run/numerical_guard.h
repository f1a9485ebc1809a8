#pragma once
// Skipping the update of a numerically bad step. One bad batch (corrupt data, a
// rare overflow) must not poison the weights and the AdamW moments for the rest
// of the run, and a run whose every step is bad must stop rather than burn its
// allocation (MegaScale, Jiang et al., NSDI 2024, and ByteRobust, ByteDance 2025,
// both watch the loss and gradient norm for NaN and spikes). A step is bad when
// its global loss or gradient norm is NaN or infinite, or, with a spike factor,
// when its loss exceeds that factor times the median loss of the recent good
// steps. Its optimizer update is skipped (the batch is dropped, the step counts);
// max_bad_steps bad steps in a row make the training loop (run/training_loop.cpp) roll
// the run back to the newest checkpoint before them and skip their batches, or
// stop it when there is no checkpoint to return to, the loader cannot replay
// batches, or rolling back keeps ending in bad steps.
//
// The inputs are the step's global loss and gradient norm, which every rank holds;
// the training loop still all-reduces the verdict so that all ranks skip together.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hdp {

enum class StepFault { None, NonFinite, Spike };

class NumericalGuard {
 public:
  // spike_factor: 0 = no spike detection, else > 1. max_bad_steps >= 1.
  NumericalGuard(double spike_factor, int64_t max_bad_steps);

  // This rank's verdict on a step (does not record it).
  StepFault inspect(double loss, double grad_norm) const;
  // Records the verdict every rank agreed on. Returns true when it is the
  // max_bad_steps-th bad step in a row: the run must roll back or stop.
  bool record(StepFault fault, double loss);

  int64_t bad_in_a_row() const { return bad_in_a_row_; }
  // The median of the recent good losses a spike is measured against; 0 before any.
  double median() const;

  // The good losses the median is taken over, oldest first (at most kWindow), and
  // how to put them back: a checkpoint carries them, so a resumed run judges
  // spikes against the same history as one that never stopped.
  std::vector<double> window() const;
  void restore_window(const std::vector<double>& losses);
  // Forgets the current streak of bad steps (after a rollback).
  void reset_streak() { bad_in_a_row_ = 0; }

  // Good losses the median is taken over, and how many are needed before spikes count.
  static constexpr size_t kWindow = 50;
  static constexpr size_t kMinHistory = 10;

 private:
  double spike_factor_;
  int64_t max_bad_steps_;
  int64_t bad_in_a_row_ = 0;
  // Losses of the last kWindow good steps, a ring (fixed size: a step never allocates).
  std::array<double, kWindow> recent_{};
  size_t recorded_ = 0;  // good steps seen so far; the ring holds min(recorded_, kWindow)
  mutable std::array<double, kWindow> sorted_{};  // scratch of median()
};

// "loss is nan", "loss 9.1 is above 3 x the recent median 2.5", ... for messages.
std::string describe_fault(StepFault fault, double loss, double grad_norm, double spike_factor, double median);

}  // namespace hdp
