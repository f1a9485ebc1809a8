// The pieces of "training that survives" below the training loop: the numerical
// guard's verdicts and streaks, and the stop-signal handlers (first signal
// recorded, second one exits at once). End to end through the trainer binary:
// tests/training_test.cpp and tests/training_parallel_test.cpp.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <limits>

#include "trainer/numerical_guard.h"
#include "trainer/signals.h"

namespace hdp {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(NumericalGuard, NanOrInfiniteLossOrGradientNormIsBad) {
  const NumericalGuard guard(0, 3);
  EXPECT_EQ(guard.inspect(2.5, 1.0), StepFault::None);
  EXPECT_EQ(guard.inspect(kNan, 1.0), StepFault::NonFinite);
  EXPECT_EQ(guard.inspect(2.5, kNan), StepFault::NonFinite);
  EXPECT_EQ(guard.inspect(kInf, 1.0), StepFault::NonFinite);
  EXPECT_EQ(guard.inspect(2.5, -kInf), StepFault::NonFinite);
}

TEST(NumericalGuard, SpikesCountOnlyWithAFactorAndEnoughHistory) {
  NumericalGuard off(0, 3), on(3, 3);
  for (size_t i = 0; i + 1 < NumericalGuard::kMinHistory; ++i) {
    on.record(StepFault::None, 2.0);
    off.record(StepFault::None, 2.0);
  }
  EXPECT_EQ(on.inspect(100, 1), StepFault::None) << "too little history to judge";
  on.record(StepFault::None, 4.0);
  off.record(StepFault::None, 4.0);
  EXPECT_EQ(on.median(), 2.0);
  EXPECT_EQ(on.inspect(6.0, 1), StepFault::None) << "exactly 3 x the median is not above it";
  EXPECT_EQ(on.inspect(6.01, 1), StepFault::Spike);
  EXPECT_EQ(off.inspect(100, 1), StepFault::None) << "spike_factor 0 turns spike detection off";
}

TEST(NumericalGuard, MedianFollowsTheRecentGoodStepsOnly) {
  NumericalGuard guard(2, 5);
  for (size_t i = 0; i < NumericalGuard::kWindow; ++i) guard.record(StepFault::None, 10.0);
  for (size_t i = 0; i < NumericalGuard::kWindow / 2 + 1; ++i) guard.record(StepFault::None, 1.0);
  EXPECT_EQ(guard.median(), 1.0) << "the newer half of the window decides";
  guard.record(StepFault::Spike, 50.0);  // bad steps do not enter the window
  EXPECT_EQ(guard.median(), 1.0);
  EXPECT_EQ(guard.inspect(2.5, 1), StepFault::Spike);
}

TEST(NumericalGuard, MaxBadStepsInARowStopAndAGoodStepResetsTheStreak) {
  NumericalGuard guard(0, 3);
  EXPECT_FALSE(guard.record(StepFault::NonFinite, kNan));
  EXPECT_FALSE(guard.record(StepFault::NonFinite, kNan));
  EXPECT_FALSE(guard.record(StepFault::None, 2.0));
  EXPECT_EQ(guard.bad_in_a_row(), 0);
  EXPECT_FALSE(guard.record(StepFault::NonFinite, kNan));
  EXPECT_FALSE(guard.record(StepFault::Spike, 9.0));
  EXPECT_TRUE(guard.record(StepFault::NonFinite, kNan));
  EXPECT_EQ(guard.bad_in_a_row(), 3);
  NumericalGuard strict(0, 1);
  EXPECT_TRUE(strict.record(StepFault::NonFinite, kNan)) << "max_bad_steps 1 stops at the first bad step";
}

// Death tests run the body in a child process, so the handlers and the signals
// stay out of the test runner.
TEST(StopSignals, TheFirstSignalIsRecordedAndAnnounced) {
  EXPECT_EXIT(
      {
        install_stop_handlers(true);
        if (stop_signal() != 0) _exit(1);
        raise(SIGTERM);
        _exit(stop_signal() == SIGTERM ? 7 : 2);
      },
      ::testing::ExitedWithCode(7), "SIGTERM received: finishing the current step, writing a checkpoint");
}

TEST(StopSignals, ASecondSignalExitsAtOnceWith128PlusItsNumber) {
  EXPECT_EXIT(
      {
        install_stop_handlers(false);
        raise(SIGUSR1);
        raise(SIGINT);
        _exit(0);
      },
      ::testing::ExitedWithCode(128 + SIGINT), "SIGINT received a second time: exiting at once, without a checkpoint");
}

}  // namespace
}  // namespace hdp
