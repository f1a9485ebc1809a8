#pragma once
// Asynchronous checkpoints. Saving every step is what makes a failure cost at most
// one step (ByteRobust, ByteDance 2025, checkpoints every step at under 1% of step
// time; Gemini's and CheckFreq's designs are alike): the state is copied to host
// memory at the step boundary (a snapshot: the parameters, this rank's moment
// shards, the progress), and a background thread writes the part and commits the
// checkpoint while training continues, at the lowest CPU priority (nice 19), so
// that it competes as little as it can with the training threads for the cores.
// The commit protocol is that of save_checkpoint (checkpoint/protocol.h): parts
// into step-N.tmp/, rank 0 writes the manifest last and renames the directory, so
// a directory under its final name is always complete. The ranks' writer threads
// agree over a communicator of their own (a duplicate of the training world, used
// by no other thread), so their collectives never mix with training's.
//
// A new snapshot waits only if the previous write still runs (one snapshot buffer,
// reused). cost_ms() says what a checkpoint costs the run, so that the caller can
// space them to keep within a budget (run/training_loop.h, train.checkpoint_budget).
// An error of a background write is rethrown by the next check(), save() or wait()
// (a CheckpointError naming the path: exit code 2), never lost. Stops and the end
// of training wait for the write in flight.

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "checkpoint/protocol.h"
#include "parallel/mpi_communicator.h"

namespace hdp {

class CheckpointWriter {
 public:
  // layout.world is the training world. async: write in a background thread,
  // committing over a duplicate of the world (collective over it: every training
  // rank constructs its writer at the same point); needs MPI_THREAD_MULTIPLE when
  // the world has several ranks. Otherwise save() writes before it returns.
  // hooks: save_checkpoint's test knobs for the checkpoint of a step. tokenizer: the
  // data's tokenizer copy, put in every checkpoint (needed on rank 0 only).
  CheckpointWriter(std::string checkpoint_dir, std::string config_yaml, int64_t keep, const CheckpointLayout& layout,
                   bool async, bool announce, std::function<CheckpointHooks(int64_t step)> hooks = {},
                   std::optional<TokenizerFiles> tokenizer = std::nullopt);
  // Waits for the write in flight (its error, if any, is logged, not thrown).
  // Unwinding from an error of a job of several ranks it does not wait: the write
  // may wait for a peer's commit collective, and the job is aborted next.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // A checkpoint of the state now (`progress.step`). Waits for the previous write
  // first and rethrows its error.
  void save(const LlamaModel& model, const ZeroAdamW& optimizer, const TrainingProgress& progress);
  // Waits for the write in flight; rethrows its error.
  void wait();
  // Rethrows the error of a background write that has finished, without waiting.
  void check();

  bool async() const { return async_; }
  // Milliseconds the last save() blocked the training thread (waiting for the previous
  // write, then the snapshot; the whole write when synchronous).
  double last_blocking_ms() const { return last_blocking_ms_; }
  // What a checkpoint costs the run, in ms: the training thread's wait in save()
  // plus, when asynchronous, the CPU time of the writer thread, which it takes from
  // the cores that train (its wall time under nice 19 does not show that); the
  // last finished checkpoint's, and while one is being written at least its wait.
  // 0 before the first save().
  double cost_ms() const { return std::max(last_cost_ms_.load(std::memory_order_acquire), last_blocking_ms_); }
  // Whether an asynchronous write has not finished yet: a save() now would block on it.
  bool writing() const { return !done_.load(std::memory_order_acquire); }

 private:
  // The snapshot, on the background thread or the caller's; blocking_ms: what its
  // save() took from the training thread.
  void write(int64_t step, double blocking_ms);
  void join_and_rethrow();

  std::string checkpoint_dir_;
  std::string config_yaml_;
  int64_t keep_;
  CheckpointLayout layout_;  // world: the writer's own communicator when async
  bool async_;
  bool announce_;
  std::function<CheckpointHooks(int64_t)> hooks_;
  std::optional<TokenizerFiles> tokenizer_;
  std::unique_ptr<MpiCommunicator> commit_world_;
  CheckpointSnapshot snapshot_;
  std::thread thread_;
  std::atomic<bool> done_{true};
  std::exception_ptr error_;
  double last_blocking_ms_ = 0;
  std::atomic<double> last_cost_ms_{0};  // set by the writer thread
};

}  // namespace hdp
