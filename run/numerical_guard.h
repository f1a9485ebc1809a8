#pragma once
// Skipping the update of a numerically bad step. One bad batch (corrupt data, a
// rare overflow) must not poison the weights and the AdamW moments for the rest
// of the run, and a run whose every step is bad must stop rather than burn its
// allocation (MegaScale, Jiang et al., NSDI 2024, and ByteRobust, ByteDance 2025,
// both watch the loss and gradient norm for NaN and spikes). A step is bad when
// its global loss or gradient norm is NaN or infinite, or when its loss exceeds
// train.spike_factor times the median loss of the recent good steps, or its
// gradient norm train.grad_norm_spike_factor times their median gradient norm.
// Its optimizer update is skipped (the batch is dropped, the step counts);
// max_bad_steps bad steps in a row make the training loop (run/training_loop.cpp)
// roll the run back to the newest checkpoint before them that the guard confirmed
// (warm(), below) and skip their batches, or stop it (DivergenceError) when there
// is no such checkpoint to return to (rollbacks that keep ending in bad steps mark
// theirs suspect) or the loader cannot replay batches.
//
// Warm-up: spikes count from the second step on, against the good steps so far.
// The first step's loss and gradient norm are the only ones no update has touched
// (the weights are as initialised or loaded), so they are the reference a blow-up
// of the first updates is measured against; a guard that waited for a full
// window would take such a blow-up as its history.
//
// The inputs are the step's global loss and gradient norm, which every rank holds;
// the training loop still all-reduces the verdict so that all ranks skip together.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hdp {

// Ordered by severity: the training loop all-reduces the verdicts with max.
enum class StepFault { None = 0, GradNormSpike = 1, LossSpike = 2, NonFinite = 3 };

// The run diverges: bad steps persist and neither skipping them nor rolling back
// helps. A restart would replay the same steps, so it has an exit code of its own
// (3, trainer/command_line.h) that `trainer supervise` does not retry.
class DivergenceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SpikeFactors {
  double loss = 0;       // train.spike_factor: 0 = no loss spikes, else > 1
  double grad_norm = 0;  // train.grad_norm_spike_factor: 0 = no gradient-norm spikes, else > 1
};

class NumericalGuard {
 public:
  // max_bad_steps >= 1.
  NumericalGuard(SpikeFactors factors, int64_t max_bad_steps);

  // This rank's verdict on a step (does not record it).
  StepFault inspect(double loss, double grad_norm) const;
  // Records the verdict every rank agreed on. Returns true when it is the
  // max_bad_steps-th bad step in a row: the run must roll back or stop.
  bool record(StepFault fault, double loss, double grad_norm);

  int64_t bad_in_a_row() const { return bad_in_a_row_; }
  // The medians of the recent good losses and gradient norms spikes are measured
  // against; 0 before any good step.
  double loss_median() const { return losses_.median(); }
  double grad_norm_median() const { return grad_norms_.median(); }

  // The good losses and gradient norms the medians are taken over, oldest first
  // (at most kWindow each), and how to put them back: a checkpoint carries them, so
  // a resumed run judges spikes against the same history as one that never stopped.
  std::vector<double> loss_window() const { return losses_.values(); }
  std::vector<double> grad_norm_window() const { return grad_norms_.values(); }
  void restore_windows(const std::vector<double>& losses, const std::vector<double>& grad_norms);
  // Whether the guard has passed a step it judged: every good step but the first
  // (of the run, or after a checkpoint without a window), which has no history to
  // be judged against. From then on a blow-up is flagged, so the weights saved are
  // trusted as a rollback target (run/training_loop.h).
  bool warm() const { return losses_.size() >= 2; }
  // Forgets the current streak of bad steps (after a rollback).
  void reset_streak() { bad_in_a_row_ = 0; }

  // "loss 9.1 is above train.spike_factor 3 x the median 2.5 of the recent good steps", ...
  std::string describe(StepFault fault, double loss, double grad_norm) const;

  // Good steps the medians are taken over.
  static constexpr size_t kWindow = 50;

 private:
  // The last kWindow values, a ring (fixed size: a step never allocates).
  class Window {
   public:
    void add(double value);
    void restore(const std::vector<double>& values);
    std::vector<double> values() const;
    size_t size() const { return std::min(recorded_, kWindow); }
    double median() const;

   private:
    std::array<double, kWindow> recent_{};
    size_t recorded_ = 0;  // values seen so far; the ring holds min(recorded_, kWindow)
    mutable std::array<double, kWindow> sorted_{};  // scratch of median()
  };

  SpikeFactors factors_;
  int64_t max_bad_steps_;
  int64_t bad_in_a_row_ = 0;
  Window losses_, grad_norms_;
};

}  // namespace hdp
