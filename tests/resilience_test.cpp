// The pieces of "training that survives" below the training loop: the numerical
// guard's verdicts, streaks and window, the fault-injection knob, the stop-signal
// handlers (first signal recorded, second one exits at once), the progress marker
// and the thread-stack dump of the hang watchdog, its end of a job on a device
// stream's asynchronous error, and metrics lines that never tear.
// End to end through the trainer binary:
// tests/training_test.cpp and tests/training_parallel_test.cpp.

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/fault_injection.h"
#include "parallel/device_ops.h"
#include "parallel/op_tracer.h"
#include "parallel/progress.h"
#include "test_util.h"
#include "run/hang_watchdog.h"
#include "run/metrics.h"
#include "run/numerical_guard.h"
#include "run/signals.h"
#include "run/thread_stacks.h"

namespace hdp {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(NumericalGuard, NanOrInfiniteLossOrGradientNormIsBad) {
  const NumericalGuard guard({0, 0}, 3);
  EXPECT_EQ(guard.inspect(2.5, 1.0), StepFault::None);
  EXPECT_EQ(guard.inspect(kNan, 1.0), StepFault::NonFinite);
  EXPECT_EQ(guard.inspect(2.5, kNan), StepFault::NonFinite);
  EXPECT_EQ(guard.inspect(kInf, 1.0), StepFault::NonFinite);
  EXPECT_EQ(guard.inspect(2.5, -kInf), StepFault::NonFinite);
}

// The default guard judges from the second step on, against the good steps so
// far: a blow-up of the first updates (learning rate 30 on tiny-llama: loss 5.55,
// then 44) is caught at once, not taken as history.
TEST(NumericalGuard, SpikesCountFromTheSecondStepAgainstTheGoodStepsSoFar) {
  NumericalGuard guard({3, 100}, 3), off({0, 0}, 3);
  EXPECT_EQ(guard.inspect(1e6, 1e9), StepFault::None) << "the first step has nothing to be compared with";
  guard.record(StepFault::None, 5.55, 5.75);
  off.record(StepFault::None, 5.55, 5.75);
  EXPECT_EQ(guard.loss_median(), 5.55);
  EXPECT_EQ(guard.inspect(44.29, 27.5), StepFault::LossSpike);
  EXPECT_EQ(guard.inspect(3 * 5.55, 27.5), StepFault::None) << "exactly 3 x the median is not above it";
  EXPECT_EQ(guard.inspect(5.0, 575.1), StepFault::GradNormSpike);
  EXPECT_EQ(guard.inspect(5.0, 575.0), StepFault::None) << "exactly 100 x the median is not above it";
  EXPECT_EQ(guard.inspect(44.29, 1e9), StepFault::LossSpike) << "a loss spike is the more severe verdict";
  EXPECT_EQ(off.inspect(1e6, 1e9), StepFault::None) << "factors 0 turn spike detection off";
  EXPECT_EQ(guard.describe(StepFault::LossSpike, 44.29, 27.5),
            "loss 44.29 is above train.spike_factor 3 x the median 5.55 of the recent good steps");
  EXPECT_EQ(guard.describe(StepFault::GradNormSpike, 5, 600),
            "gradient norm 600 is above train.grad_norm_spike_factor 100 x the median 5.75 of the recent good steps");
}

// The verdicts are all-reduced with max: a more severe fault has a larger value.
TEST(NumericalGuard, FaultsAreOrderedBySeverity) {
  EXPECT_LT(StepFault::None, StepFault::GradNormSpike);
  EXPECT_LT(StepFault::GradNormSpike, StepFault::LossSpike);
  EXPECT_LT(StepFault::LossSpike, StepFault::NonFinite);
}

TEST(NumericalGuard, MediansFollowTheRecentGoodStepsOnly) {
  NumericalGuard guard({2, 10}, 5);
  for (size_t i = 0; i < NumericalGuard::kWindow; ++i) guard.record(StepFault::None, 10.0, 8.0);
  for (size_t i = 0; i < NumericalGuard::kWindow / 2 + 1; ++i) guard.record(StepFault::None, 1.0, 0.5);
  EXPECT_EQ(guard.loss_median(), 1.0) << "the newer half of the window decides";
  EXPECT_EQ(guard.grad_norm_median(), 0.5);
  guard.record(StepFault::LossSpike, 50.0, 90.0);  // bad steps do not enter the windows
  EXPECT_EQ(guard.loss_median(), 1.0);
  EXPECT_EQ(guard.grad_norm_median(), 0.5);
  EXPECT_EQ(guard.inspect(2.5, 1), StepFault::LossSpike);
  EXPECT_EQ(guard.inspect(1.5, 5.5), StepFault::GradNormSpike);
}

TEST(NumericalGuard, MaxBadStepsInARowStopAndAGoodStepResetsTheStreak) {
  NumericalGuard guard({0, 0}, 3);
  EXPECT_FALSE(guard.record(StepFault::NonFinite, kNan, 1));
  EXPECT_FALSE(guard.record(StepFault::NonFinite, kNan, 1));
  EXPECT_FALSE(guard.record(StepFault::None, 2.0, 1));
  EXPECT_EQ(guard.bad_in_a_row(), 0);
  EXPECT_FALSE(guard.record(StepFault::NonFinite, kNan, 1));
  EXPECT_FALSE(guard.record(StepFault::LossSpike, 9.0, 1));
  EXPECT_TRUE(guard.record(StepFault::GradNormSpike, 2.0, 900));
  EXPECT_EQ(guard.bad_in_a_row(), 3);
  NumericalGuard strict({0, 0}, 1);
  EXPECT_TRUE(strict.record(StepFault::NonFinite, kNan, 1)) << "max_bad_steps 1 stops at the first bad step";
}

// The windows a checkpoint carries: oldest first, at most kWindow each, and a
// guard restored from them judges spikes exactly like the one they came from.
TEST(NumericalGuard, TheWindowsRoundTripThroughRestore) {
  NumericalGuard a({3, 4}, 3);
  for (size_t i = 0; i < NumericalGuard::kWindow + 7; ++i)
    a.record(StepFault::None, 1.0 + static_cast<double>(i % 13), 0.5 + static_cast<double>(i % 7));
  const std::vector<double> losses = a.loss_window(), norms = a.grad_norm_window();
  ASSERT_EQ(losses.size(), NumericalGuard::kWindow);
  ASSERT_EQ(norms.size(), NumericalGuard::kWindow);
  EXPECT_EQ(losses.back(), 1.0 + static_cast<double>((NumericalGuard::kWindow + 6) % 13)) << "newest last";
  EXPECT_EQ(norms.back(), 0.5 + static_cast<double>((NumericalGuard::kWindow + 6) % 7)) << "newest last";
  NumericalGuard b({3, 4}, 3);
  b.restore_windows(losses, norms);
  EXPECT_EQ(b.loss_window(), losses);
  EXPECT_EQ(b.grad_norm_window(), norms);
  for (auto [loss, norm] : {std::pair{2.0, 1.0}, std::pair{30.0, 1.0}, std::pair{5.5, 20.0}}) {
    EXPECT_EQ(b.inspect(loss, norm), a.inspect(loss, norm)) << loss << " " << norm;
    a.record(StepFault::None, loss, norm);
    b.record(StepFault::None, loss, norm);
    EXPECT_EQ(b.loss_window(), a.loss_window());
    EXPECT_EQ(b.grad_norm_window(), a.grad_norm_window());
  }
  NumericalGuard older({3, 4}, 3);
  older.restore_windows({2.0, 2.0}, {});
  EXPECT_EQ(older.inspect(7.0, 1e6), StepFault::LossSpike) << "a manifest without gradient norms: losses still judged";
  EXPECT_EQ(older.inspect(5.0, 1e6), StepFault::None) << "and gradient norms from the next good step on";
}

// HDP_FAULT_INJECT=RANK:STEP[-LAST][:MODE]; anything else is refused.
TEST(FaultInjection, ParsesStepRangesAndModesAndRefusesTheRest) {
  setenv("HDP_FAULT_INJECT", "1:3-5:nan", 1);
  FaultInjection f = fault_injection_from_env();
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.step, 3);
  EXPECT_EQ(f.last_step, 5);
  EXPECT_TRUE(f.nan);
  setenv("HDP_FAULT_INJECT", "0:7:hang", 1);
  f = fault_injection_from_env();
  EXPECT_EQ(f.step, 7);
  EXPECT_EQ(f.last_step, 7);
  EXPECT_TRUE(f.hang);
  setenv("HDP_FAULT_INJECT", "2:4", 1);
  f = fault_injection_from_env();
  EXPECT_FALSE(f.hang || f.nan);
  EXPECT_TRUE(f.exits());
  setenv("HDP_FAULT_INJECT", "0:2:full-metrics", 1);
  f = fault_injection_from_env();
  EXPECT_TRUE(f.full_metrics);
  EXPECT_FALSE(f.full_checkpoint || f.exits());
  setenv("HDP_FAULT_INJECT", "0:2:full-checkpoint", 1);
  f = fault_injection_from_env();
  EXPECT_TRUE(f.full_checkpoint);
  EXPECT_FALSE(f.full_metrics || f.exits());
  setenv("HDP_FAULT_INJECT", "1:2-4:slow-checkpoint", 1);
  f = fault_injection_from_env();
  EXPECT_TRUE(f.slow_checkpoint);
  EXPECT_EQ(f.last_step, 4);
  EXPECT_FALSE(f.full_checkpoint || f.exits());
  setenv("HDP_FAULT_INJECT", "1:3-4:defer-checkpoint", 1);
  f = fault_injection_from_env();
  EXPECT_TRUE(f.defer_checkpoint);
  EXPECT_FALSE(f.slow_checkpoint || f.exits());
  EXPECT_FALSE(f.defers_checkpoint(1, 2));
  EXPECT_TRUE(f.defers_checkpoint(1, 3) && f.defers_checkpoint(1, 4));
  EXPECT_FALSE(f.defers_checkpoint(1, 5) || f.defers_checkpoint(0, 3));
  setenv("HDP_FAULT_INJECT", "0:3-5:held-checkpoint", 1);
  f = fault_injection_from_env();
  EXPECT_TRUE(f.held_checkpoint);
  EXPECT_EQ(f.last_step, 5);
  EXPECT_FALSE(f.defer_checkpoint || f.defers_checkpoint(0, 3) || f.exits());
  for (const char* bad : {"2", "2:x", "2:5-3", "2:3:explode", "2:3-", "a:3", "0:2:full"}) {
    setenv("HDP_FAULT_INJECT", bad, 1);
    EXPECT_THROW(fault_injection_from_env(), std::invalid_argument) << bad;
  }
  unsetenv("HDP_FAULT_INJECT");
}

// A metrics line that crosses a file size limit (RLIMIT_FSIZE, with SIGXFSZ
// ignored as the trainer does) is written only in part: the writer cuts the file
// back to its whole lines and throws MetricsError naming the file and the step.
// In a child process, so that the limit stays out of the test runner.
TEST(MetricsWriter, ALineThatDoesNotFitIsUndoneAndNamed) {
  const std::string dir = testing::scratch_dir("metrics-size-limit");
  StepMetrics m;
  m.step = 1;
  const size_t line = to_json(m).size() + 1;  // the same for steps 1..9
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{static_cast<rlim_t>(2 * line + line / 2), RLIM_INFINITY};
    setrlimit(RLIMIT_FSIZE, &limit);
    MetricsWriter writer(dir, 0);
    for (m.step = 1; m.step <= 9; ++m.step) {
      try {
        writer.write(m);
      } catch (const MetricsError& e) {
        std::ofstream(dir + "/error.txt") << e.what();
        _exit(static_cast<int>(m.step));
      }
    }
    _exit(100);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of a signal";
  EXPECT_EQ(WEXITSTATUS(status), 3) << "steps 1 and 2 fit, step 3 crosses the limit";
  std::ifstream in(dir + "/metrics.jsonl", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  m.step = 1;
  std::string expected = to_json(m) + "\n";
  m.step = 2;
  expected += to_json(m) + "\n";
  EXPECT_EQ(text.str(), expected) << "only whole lines";
  std::ifstream error_file(dir + "/error.txt");
  std::stringstream error;
  error << error_file.rdbuf();
  EXPECT_EQ(error.str(), dir + "/metrics.jsonl: cannot write the metrics of step 3 (only " + std::to_string(line / 2) +
                             " of " + std::to_string(line) + " bytes written); free space on its file system (or raise "
                             "the file size limit) and resume from the last checkpoint");
}

// A resume cuts metrics.jsonl back to the steps it keeps in place and appends to
// it; the file is never replaced. A writer that still has it open (a job another
// one resumed under) keeps writing into the file everyone reads, not into an
// unlinked one.
TEST(MetricsWriter, AResumeCutsTheFileBackInPlaceAndNeverReplacesIt) {
  const std::string dir = testing::scratch_dir("metrics-in-place");
  const std::string path = dir + "/metrics.jsonl";
  auto read_text = [](const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  auto line_of = [](int64_t step) {
    StepMetrics m;
    m.step = step;
    return to_json(m) + "\n";
  };
  MetricsWriter first(dir, 0);
  for (int64_t step = 1; step <= 4; ++step) {
    StepMetrics m;
    m.step = step;
    first.write(m);
  }
  std::ofstream(path, std::ios::app) << "{\"step\": 5, \"loss\": 4.1";  // cut short by a crash
  struct stat before {};
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  MetricsWriter resumed(dir, 2);
  struct stat after {};
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the same file, cut back in place";
  EXPECT_EQ(read_text(path), line_of(1) + line_of(2));
  StepMetrics m;
  m.step = 3;
  resumed.write(m);
  m.step = 9;
  first.write(m);
  EXPECT_EQ(read_text(path), line_of(1) + line_of(2) + line_of(3) + line_of(9));
}

// Death tests run the body in a child process, so the handlers and the signals
// stay out of the test runner. The calling thread blocks the stop signals (the
// computing threads never take them, run/signals.cpp), so the bodies signal the
// process, as Slurm, mpirun and Ctrl-C do (raise() would signal this thread only), and
// wait for the effect on the thread that takes them (bounded: 2 s).
bool stop_signal_recorded_within_2s() {
  for (int i = 0; i < 2000 && stop_signal() == 0; ++i) usleep(1000);
  return stop_signal() != 0;
}

TEST(StopSignals, TheFirstSignalIsRecordedAndAnnounced) {
  EXPECT_EXIT(
      {
        install_stop_handlers(true);
        if (stop_signal() != 0) _exit(1);
        sigset_t blocked;
        pthread_sigmask(SIG_BLOCK, nullptr, &blocked);
        if (!sigismember(&blocked, SIGTERM) || !sigismember(&blocked, SIGINT) || !sigismember(&blocked, SIGUSR1))
          _exit(3);
        kill(getpid(), SIGTERM);
        _exit(stop_signal_recorded_within_2s() && stop_signal() == SIGTERM ? 7 : 2);
      },
      ::testing::ExitedWithCode(7), "SIGTERM received: finishing the current step, writing a checkpoint");
}

TEST(StopSignals, ASecondSignalExitsAtOnceWith128PlusItsNumber) {
  EXPECT_EXIT(
      {
        install_stop_handlers(false);
        kill(getpid(), SIGUSR1);
        if (!stop_signal_recorded_within_2s()) _exit(1);
        kill(getpid(), SIGINT);
        sleep(2);
        _exit(0);
      },
      ::testing::ExitedWithCode(128 + SIGINT), "SIGINT received a second time: exiting at once, without a checkpoint");
}

// The hang watchdog's view of the training thread (parallel/progress.h): the
// phase text names the context, the group, the operation and the peer; the
// counter moves at every change; scopes on other threads change nothing.
TEST(ProgressMarker, NamesThePhaseAndMovesOnEveryChangeOfTheWatchedThreadOnly) {
  EXPECT_EXIT(
      {
        progress::watch_this_thread();
        progress::set_step(7);
        const uint64_t c0 = progress::snapshot().counter;
        {
          progress::Context context("ring attention forward");
          progress::Waiting waiting("recv from", "hdp", 4);
          const progress::Snapshot s = progress::snapshot();
          if (s.phase != "ring attention forward: hdp recv from rank 4" || !s.waiting || s.step != 7) _exit(1);
          if (s.counter <= c0) _exit(2);
          // Another thread's scopes (a loader or copy thread) leave the marker alone.
          std::thread([&] {
            progress::Context other("elsewhere");
            progress::Waiting w("all-reduce", "world");
          }).join();
          if (progress::snapshot().counter != s.counter) _exit(3);
        }
        const progress::Snapshot after = progress::snapshot();
        if (after.waiting || after.phase != "start-up") _exit(4);
        {
          progress::Context context("grads-sync");
          progress::Waiting waiting("reduce-scatter", "hdp");
          if (progress::snapshot().phase != "grads-sync: hdp reduce-scatter") _exit(5);
        }
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// A device stream (the NCCL communicator's, parallel/device_ops.h) whose one
// operation never finishes and whose communicator reports an asynchronous error.
class FailedDeviceStream final : public DeviceStream {
 public:
  std::optional<DeviceTimes> finished(uint64_t) override { return std::nullopt; }
  void release(uint64_t) override {}
  std::string async_error() override { return "tp: NCCL error: remote process exited or there was a network error"; }
};

// Under NCCL the host never waits in a collective: the watchdog polls the device
// streams' asynchronous errors and ends the job at once (exit 1), naming the rank,
// the group, the error and the unfinished operation, in the summary and beside the
// stacks. Rank 3 watching only itself, with a timeout far beyond the test.
TEST(HangWatchdog, AnAsyncDeviceErrorEndsTheJobNamingRankGroupAndUnfinishedOperation) {
  const std::string dir = testing::scratch_dir("watchdog_device_error");
  EXPECT_EXIT(
      {
        FailedDeviceStream stream;
        device_ops().attach(&stream);
        device_ops().enqueued(&stream, 0, DeviceOp{"tp", "all-reduce", 4 << 20}, OpTracer::local_us());
        HangWatchdog watchdog(HangWatchdogOptions{600, dir, "host-a", 3}, nullptr);
        std::this_thread::sleep_for(std::chrono::seconds(30));
        _exit(0);  // the watchdog did nothing
      },
      ::testing::ExitedWithCode(1), "");
  std::ifstream summary(dir + "/hang/summary.txt");
  std::string line;
  std::getline(summary, line);
  EXPECT_EQ(line.rfind("rank 3: tp: NCCL error: remote process exited or there was a network error; tp all-reduce "
                       "of 4.0 MiB enqueued ",
                       0),
            0u)
      << line;
  EXPECT_NE(line.find(" s ago had not finished. Ending the job (exit code 1)."), std::string::npos) << line;
  std::stringstream stacks;
  stacks << std::ifstream(dir + "/hang/rank-3.txt").rdbuf();
  EXPECT_NE(stacks.str().find("phase: start-up (device: tp all-reduce of 4.0 MiB unfinished)"), std::string::npos)
      << stacks.str();
  EXPECT_NE(stacks.str().find("oldest unfinished device operation: tp all-reduce of 4.0 MiB, enqueued "),
            std::string::npos)
      << stacks.str();
}

// Without MPI_THREAD_MULTIPLE a rank watches only itself: a rank other than 0 that
// keeps making progress has no peers to miss (it once took its own missing
// heartbeat slot for a silent rank 0 and declared a hang after hang_timeout_s).
TEST(HangWatchdog, ARankWatchingOnlyItselfHasNoSilentPeers) {
  const std::string dir = testing::scratch_dir("watchdog_alone");
  EXPECT_EXIT(
      {
        progress::watch_this_thread();
        HangWatchdog watchdog(HangWatchdogOptions{1.0, dir, "host-a", 3}, nullptr);
        for (int i = 0; i < 80; ++i) {  // 2 s of progress: twice the timeout
          progress::Context context(i % 2 ? "forward" : "backward");
          std::this_thread::sleep_for(std::chrono::milliseconds(25));
        }
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// A function whose name must appear, symbolised, in the dump of a thread blocked in it.
__attribute__((noinline)) void blocked_in_a_function_with_a_known_name(std::atomic<bool>& release,
                                                                       std::atomic<bool>& entered) {
  entered = true;
  while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  asm volatile("");  // keeps the frame from being a tail call
}

TEST(ThreadStacks, ListEveryThreadWithItsFunctionsNamed) {
  std::atomic<bool> release{false}, entered{false};
  std::thread blocked([&] { blocked_in_a_function_with_a_known_name(release, entered); });
  while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string text = thread_stacks_text();
  release = true;
  blocked.join();
  EXPECT_NE(text.find("[main]"), std::string::npos) << text;
  EXPECT_NE(text.find("[watchdog, this dump]"), std::string::npos) << text;
  EXPECT_NE(text.find("blocked_in_a_function_with_a_known_name"), std::string::npos) << text;
  EXPECT_EQ(text.find("did not answer"), std::string::npos) << text;
}

}  // namespace
}  // namespace hdp
