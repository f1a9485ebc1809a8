#pragma once
// A training rank's steps after the step it starts from up to train.steps: each
// takes the next prefetched batch (run/batch_source.h), runs the engine's
// forward_backward, lets every rank agree whether to apply the update (the
// numerical guard's verdict and the stop signals, run/numerical_guard.h,
// run/signals.h) and applies it or skips it, records its metrics (rank 0 writes
// them) and, when due, writes a checkpoint. Bad steps in a row roll the run back.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/fault_injection.h"
#include "base/progress_meter.h"
#include "checkpoint/format.h"
#include "checkpoint/lock.h"
#include "checkpoint/manifest.h"
#include "checkpoint/writer.h"
#include "config/config.h"
#include "data/batch.h"
#include "parallel/process_groups.h"
#include "parallel/runtime.h"
#include "run/batch_source.h"
#include "run/engine.h"
#include "run/metrics.h"
#include "run/numerical_guard.h"
#include "run/step_tracer.h"
#include "run/tensorboard.h"

namespace hdp {

class TrainingLoop {
 public:
  TrainingLoop(const Config& config, const ProcessInfo& process, ProcessGroups& groups, TrainingEngine& engine,
               BatchSource& batches, const TrainingProgress& progress, double peak_flops, size_t memory_bytes,
               std::vector<const DirectoryLock*> locks);

  // Runs the steps; stops early, after a checkpoint, when a rank received a stop
  // signal (run/signals.h).
  void run();

  // The stop signal the ranks agreed on (0: none, the run went to train.steps), and the last step run.
  int stopped_by() const { return stop_signal_; }
  int64_t last_step() const { return last_step_; }

  // Rank 0's metrics file.
  const std::string& metrics_path() const { return metrics_->path(); }

 private:
  // What one step measured on this rank.
  struct StepMeasurement {
    int64_t step = 0;
    double lr = 0;
    StepResult result;
    bool updated = false;  // the ranks agreed to apply the update (agree_on_update)
    double step_ms = 0;
    double data_wait_ms = 0;
    int64_t offloaded_bytes = 0;  // activations this rank copied to host memory
  };

  void run_step(int64_t step);

  // Between the engine's forward_backward and apply_update, on every rank, once the
  // step's loss and gradient norm are known: one all-reduce (max) of this rank's
  // verdict, of whether it received a stop signal, of whether a checkpoint now
  // would exceed its train.checkpoint_budget and of its checkpoint cost, so that
  // every rank skips the same updates, stops after the same step and defers the
  // same checkpoints. Returns whether to apply the update.
  bool agree_on_update(const StepResult& result, int64_t step);

  // A step whose update was skipped: say why on rank 0, with the batch's
  // documents. At train.max_bad_steps in a row, roll back (every rank alike) to
  // the newest checkpoint before the streak and skip its global batches, or stop
  // when there is none. Returns true when it rolled back.
  bool report_bad_step(int64_t step);

  // The checkpoint a rollback of the current streak returns to: the newest one
  // before its first bad step (their updates were skipped, but the model may have
  // been drifting before the guard saw it) that the guard confirmed (manifest.h:
  // saved once the guard was warm, or followed by a step it passed since) and that
  // is not suspect. When this run rolled back before and ran into bad steps again
  // before passing the last step of the earlier streak, the checkpoint it
  // returned to is marked suspect (in its manifest: `resume: auto` passes it by
  // too) and the rollback goes past it. None, with the reason, when checkpoints are
  // off, the remote loader cannot replay batches, or no such checkpoint is left.
  std::optional<std::string> rollback_target(std::string* why_not);

  // Loads `target` on every rank, records the streak's global batches as skipped
  // (in the checkpoint's manifest too, so that a run resumed from it skips them as
  // well) and goes on after it. Checkpoints newer than the target belong to the
  // abandoned trajectory and are deleted; so are their metrics lines. The
  // recovery recipe of PaLM (Chowdhery et al. 2022) and ByteRobust (ByteDance,
  // 2025): restart before the spike and skip the batches around it.
  void rollback(const std::string& target, const std::string& what);

  // The step's metrics record. A collective over the world: the job-wide figures
  // (ring traffic, offloaded bytes, every rank's measured and planned busy time)
  // are sums over the training ranks.
  StepMetrics step_metrics(const StepMeasurement& measured, const GlobalBatch& batch);

  void log_step(const StepMetrics& m) const;

  bool checkpoint_due(int64_t step) const;

  // Whether a step the guard passed saves a checkpoint: one due now, one deferred
  // before, or a stop signal's. A checkpoint costs the run what the writer says
  // (checkpoint/writer.h: the training thread's wait plus the writer's CPU time);
  // with train.checkpoint_budget B > 0 a due checkpoint is written only once cost
  // / B has passed since the previous one started, on every rank (the veto of any
  // rank, agreed in agree_on_update), and no rank's previous write is still in
  // flight, else it is deferred to the first step at which that holds. So
  // checkpoints take at most about B of the run's time and do not wait for one
  // another, and one starts at least every max(checkpoint_every steps, cost / B,
  // the previous write's time) + a step, so at most the steps of two such
  // intervals are lost to a failure. The last step and a stop signal's
  // step are always saved, waiting for the write in flight; B = 0 saves every due
  // checkpoint.
  bool checkpoint_now(int64_t step, double step_ms);

  // This rank's side of the budget: no write is in flight, and since the previous
  // checkpoint started at least its cost / train.checkpoint_budget has passed
  // (at `step`, unless HDP_FAULT_INJECT=R:S-L:defer-checkpoint defers it).
  bool checkpoint_within_budget(int64_t step) const;

  // Rank 0, once in a deferral (at its first step with no write of its own in flight,
  // so that the cost is known): what a checkpoint costs and how far apart the budget
  // puts them; said again only when that interval changes twofold.
  void report_deferral(int64_t step, double step_ms);

  // Once the guard is warm, rank 0 marks the checkpoints saved before as confirmed
  // (after the write in flight, which may be one of them).
  void confirm_checkpoints_once_warm();

  // A collective over the world (checkpoint/protocol.h): the model, the optimizer, and the
  // sampler position after `batch`, so that a resumed run goes on with the next one.
  void save_checkpoint_at(int64_t step, const GlobalBatch& batch);

  const Config& config_;
  std::vector<const DirectoryLock*> locks_;  // rank 0: refreshed every step
  const ProcessInfo& process_;
  ProcessGroups& groups_;
  TrainingEngine& engine_;
  BatchSource& batches_;
  TrainingProgress progress_;
  const double peak_flops_;
  const size_t memory_bytes_;  // the engine's device memory, reported as peak_mem_bytes
  const CheckpointLayout layout_;
  const std::string checkpoint_dir_;  // resolved_checkpoint_dir
  std::optional<MetricsWriter> metrics_;  // rank 0
  std::optional<TensorBoardWriter> tensorboard_;  // rank 0, with metrics.tensorboard
  ProgressMeter clock_;      // since run() began: the step line's elapsed time and ETA
  int64_t first_step_ = 0;   // the step run() started after
  // The last step run_step finished (its metrics written), read by the writer thread
  // under HDP_FAULT_INJECT=R:S-L:held-checkpoint; declared before writer_, which
  // joins its thread when destroyed.
  std::atomic<int64_t> finished_step_{0};
  std::optional<CheckpointWriter> writer_;  // train.checkpoint_every > 0
  FaultInjection fault_;
  NumericalGuard guard_;
  StepTracer tracer_;  // the trace section (docs/tracing.md)
  // What the ranks agreed on for the current step (agree_on_update).
  StepFault step_fault_ = StepFault::None;
  std::string fault_description_;
  bool too_many_bad_ = false;  // max_bad_steps bad steps in a row
  int stop_signal_ = 0;        // a stop signal some rank received, agreed by all
  bool checkpoint_over_budget_ = false;  // some rank's checkpoint now would exceed the budget, agreed by all
  double checkpoint_cost_ms_ = 0;       // the most a checkpoint costs any rank (CheckpointWriter::cost_ms)
  std::chrono::steady_clock::time_point last_checkpoint_start_{};  // this rank's; the epoch before the first
  bool checkpoint_deferred_ = false;    // a due checkpoint waits for the budget (checkpoint_now)
  bool deferral_reported_ = false;      // rank 0 said the current deferral (report_deferral)
  int64_t reported_interval_steps_ = 0;  // report_deferral's last interval, 0 before it said one
  int64_t last_step_ = 0;
  int64_t next_step_ = 1;
  int64_t last_poisoned_step_ = 0;  // HDP_FAULT_INJECT=R:S-L:nan: the last step poisoned
  // The current streak of bad steps: each step, where its global batch starts and its documents.
  struct BadStep {
    int64_t step;
    SamplerState start;
    std::string documents;
  };
  std::vector<BadStep> streak_;
  // The last rollback of this run: the checkpoint it returned to and the streak of
  // bad steps that made it.
  struct Rollback {
    std::string target;
    int64_t target_step;
    int64_t first_bad_step;
    int64_t last_bad_step;
  };
  std::optional<Rollback> last_rollback_;
  std::vector<int64_t> suspect_steps_;  // never returned to again by this run
  // The newest step the guard passed since the start or the last rollback, and
  // whether checkpoints saved before the guard was warm may await confirmation.
  // Alike on every rank: the guard's verdicts are agreed.
  int64_t newest_good_step_ = 0;
  bool awaiting_confirmation_ = false;
};

}  // namespace hdp
