#pragma once
// Hang detection: no hang is ever silent. A job whose rank is stopped (SIGSTOP,
// a frozen node), wedged in a kernel or a driver, or waiting for a peer that is,
// otherwise spins forever in a collective with nothing logged. MegaScale (Jiang
// et al., NSDI 2024) and ByteRobust (ByteDance, 2025) both watch every rank with
// a heartbeat and, on a hang, compare all ranks' stacks to name the odd ones out.
//
// Here, one watchdog thread per training rank:
//   - watches this rank's progress marker (parallel/progress.h): the training
//     thread moves it at every phase change, so every blocking wait on other ranks
//     (collectives, pipeline and ring receives, ...) and every compute phase is
//     covered by one deadline, train.hang_timeout_s;
//   - sends a heartbeat (step and phase) to every other training rank, and hears
//     theirs, on a message channel of its own (parallel/message_channel.h). It
//     runs beside the stuck collective and needs none: ranks that still run can
//     talk while one is stopped;
//   - when this rank made no progress for hang_timeout_s, or a peer sent no
//     heartbeat for that long, it declares a hang: it tells every rank, each rank
//     that can writes the stacks of all its threads and its phase to
//     RUN_DIR/hang/rank-N.txt and reports its phase back; the rank that declared
//     it groups the ranks by phase, names the silent ones ("rank 1 sent no
//     heartbeat for 12 s; ranks 0, 2, 3 wait in grads-sync: hdp reduce-scatter"),
//     logs that and writes RUN_DIR/hang/summary.txt, and ends the job (MPI_Abort,
//     exit code 1), within hang_timeout_s + about 15 s.
//   - under NCCL, where a collective returns before it runs, the phase also names
//     the oldest unfinished device operation (parallel/device_ops.h), and an
//     NCCL communicator's asynchronous error, polled every tick, ends the job at
//     once naming the rank, the group and that operation.
// Without MPI_THREAD_MULTIPLE (no messages from a second thread) each rank only
// watches itself.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/message_channel.h"
#include "parallel/mpi_communicator.h"

namespace hdp {

struct HangWatchdogOptions {
  double timeout_s = 600;  // train.hang_timeout_s
  std::string run_dir;     // hang reports go to run_dir/hang/
  std::string hostname;
  int rank = 0;            // this rank in the training world (= its world rank)
};

class HangWatchdog {
 public:
  // Collective over `training_world` when it is given (the watchdog's channel is a
  // duplicate of it); nullptr: this rank watches only itself.
  HangWatchdog(const HangWatchdogOptions& options, const MpiCommunicator* training_world);
  // Stops watching and tells the peers this rank is done (no longer a silent peer).
  ~HangWatchdog();
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

  // The time a tick, a heartbeat period and the wait for reports take for a timeout.
  static double tick_s(double timeout_s);
  static double beat_period_s(double timeout_s);
  static double report_grace_s(double timeout_s);

 private:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    Clock::time_point last_heard;
    int64_t step = 0;
    std::string phase;
    bool heard = false;      // any heartbeat or report received
    bool finished = false;   // said goodbye
    bool reported = false;   // answered this hang's notice
    bool waiting = false;
    int64_t progress_age_ms = 0;
  };

  void run();
  void send_beats(Clock::time_point now);
  // Reads every message that arrived; answers hang notices. Returns the lowest
  // rank that declared a hang this rank has answered, or -1.
  int drain(Clock::time_point now);
  void answer_notice(int coordinator);
  // Declares a hang: notices, own stacks, reports, the summary, MPI_Abort.
  [[noreturn]] void coordinate(const std::string& reason);
  // A device stream's communicator failed (ncclCommGetAsyncError): logs the error with
  // this rank and the unfinished operation, writes the stacks, ends the job.
  [[noreturn]] void fail_on_device_error(const std::string& error);
  // After answering a notice: waits for the job to end, ends it if nobody does.
  [[noreturn]] void await_abort(int coordinator);
  std::string write_stacks(const std::string& cause);
  std::string summary(const std::string& reason);

  HangWatchdogOptions options_;
  std::unique_ptr<MessageChannel> channel_;
  std::vector<Peer> peers_;  // by training rank (this rank's entry unused)
  // This rank's index in peers_: its rank, or 0 when it watches only itself (no channel,
  // peers_ holds only its own entry).
  int self_ = 0;
  Clock::time_point last_change_;
  uint64_t last_counter_ = 0;
  Clock::time_point last_beat_;
  int answered_ = -1;  // lowest coordinator this rank answered
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hdp
