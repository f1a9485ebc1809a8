#include "run/training.h"

#include <spdlog/spdlog.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "base/fault_injection.h"
#include "data/remote_loader.h"
#include "data/prefetcher.h"
#include "data/sampler.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/cuda_runtime.h"
#include "parallel/message_channel.h"
#include "parallel/nccl_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/progress.h"
#include "checkpoint/directory.h"
#include "checkpoint/lock.h"
#include "checkpoint/protocol.h"
#include "checkpoint/writer.h"
#include "run/planner_cost.h"
#include "run/engine.h"
#include "run/hang_watchdog.h"
#include "run/loader_roles.h"
#include "run/metrics.h"
#include "run/numerical_guard.h"
#include "run/signals.h"
#include "model/lr_schedule.h"
#include "kernels/peak_flops.h"
#include "run/step_planner.h"
#include "run/step_tracer.h"

namespace hdp {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double mib(size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

// ---- setup ----

void check_world_size(const ParallelDegrees& degrees, bool remote, int loader_ranks, const ProcessInfo& process) {
  const int training_ranks = degrees.world();
  if (training_ranks + loader_ranks != process.world_size) {
    throw ConfigError("parallel.tp x parallel.pp x parallel.hdp = " + std::to_string(degrees.tp) + " x " +
                      std::to_string(degrees.pp) + " x " + std::to_string(degrees.hdp) + " = " +
                      std::to_string(training_ranks) + " ranks" +
                      (remote ? " plus loader.servers = " + std::to_string(loader_ranks) : std::string()) +
                      ", but the job has " + std::to_string(process.world_size) + "; launch with mpirun -np " +
                      std::to_string(training_ranks + loader_ranks) + " or change the degrees");
  }
}

// The GPU of the local rank modulo those visible (CUDA_VISIBLE_DEVICES): one per
// rank when there are enough, else several ranks of a node share one.
void bind_gpu(const TrainConfig& train, const ProcessInfo& process) {
  std::string why;
  if (!cuda::available(&why)) {
    throw ConfigError("train.device: cuda asked for, but rank " + std::to_string(process.rank) + " on " +
                      process.hostname + " has no usable CUDA device (" + why + ")");
  }
  const int visible = cuda::device_count();
  const int gpu = process.local_rank % visible;
  cuda::initialize(gpu);
  cuda::set_tf32(train.tf32);
  spdlog::info("rank {} (local rank {}): GPU {} of {} visible{}, {}{}", process.rank, process.local_rank, gpu,
               visible, process.local_size > visible ? " (shared by the node's ranks)" : "",
               cuda::device_description(), train.tf32 ? ", fp32 GEMMs on TF32 tensor cores" : "");
  if (train.precision == DType::BF16 && process.rank == 0)
    spdlog::warn("train.precision: bf16 on cuda runs the CUDA bf16 kernels, which are unverified until `trainer "
                 "selftest` passes on this GPU (it compares every bf16 op and bf16 training steps with the CPU)");
}

// parallel.comm resolved on the training ranks (collective over `training_world`, or
// over every rank when it is null, after bind_gpu). nccl: exit 2 when two ranks share a GPU, which NCCL refuses,
// naming them and the GPU. auto: NCCL when the ranks train on GPUs of their own and
// NCCL was built; ranks sharing a GPU (tests, small machines) go through MPI.
CommBackend choose_comm_backend(const Config& config, const MpiCommunicator* training_world,
                                const ProcessInfo& process) {
  const CommMode mode = config.parallel.comm;
  if (mode == CommMode::Mpi || config.train.device != Device::CUDA || !nccl_compiled()) return CommBackend::Mpi;
  const std::string shared = gpus_shared_by_ranks(training_world, process.hostname);
  if (shared.empty()) return CommBackend::Nccl;
  if (mode == CommMode::Nccl) {
    throw ConfigError("parallel.comm: nccl needs one GPU per rank, but " + shared +
                      " (NCCL refuses two ranks of one communicator on one GPU); give each rank its own GPU "
                      "(more GPUs, or fewer ranks per node), or set parallel.comm: mpi to stage through host memory");
  }
  if (process.rank == 0) spdlog::info("parallel.comm auto: MPI, because {}", shared);
  return CommBackend::Mpi;
}

// Rank 0's summary of the job: where the data comes from, the grid, the BLAS kernels.
void log_job(const Config& config, const std::optional<TokenDataset>& dataset, const ParallelDegrees& degrees,
             int loader_ranks) {
  const int training_ranks = degrees.world();
  if (dataset) {
    spdlog::info("dataset {}: {} documents, {} tokens", config.data.path, dataset->num_documents(),
                 dataset->num_tokens());
  } else {
    spdlog::info("data from {} loader rank(s) (world ranks {}..{}), scheduler on world rank {}", loader_ranks,
                 training_ranks, training_ranks + loader_ranks - 1, training_ranks);
  }
  spdlog::info("{}", describe_grid(degrees));
  // Documented (a rank's capacity, not its share), but rarely meant: the activation
  // memory is sized for micro_batch_tokens and a step never fills it.
  if (config.data.global_batch_tokens < config.data.micro_batch_tokens) {
    spdlog::warn("data.global_batch_tokens {} is below data.micro_batch_tokens {}: a step holds at most {} tokens, so "
                 "every micro-batch is at most {:.0f}% full while activation memory is sized for {}; lower "
                 "data.micro_batch_tokens to save memory, or raise data.global_batch_tokens",
                 config.data.global_batch_tokens, config.data.micro_batch_tokens, config.data.global_batch_tokens,
                 100.0 * config.data.global_batch_tokens / config.data.micro_batch_tokens,
                 config.data.micro_batch_tokens);
  }
  spdlog::info("CPU GEMM: {}", cpu::gemm_library_description(cpu::kGemmLibrary));
}

// The stage's layers, parameters and memory, once per pipeline stage.
void log_stage(TrainingEngine& engine, const MemoryReport& memory, const GridCoords& coords) {
  if (coords.tp_rank != 0 || coords.hdp_rank != 0) return;
  std::string layers;
  for (int64_t n : engine.stage_layers()) layers += (layers.empty() ? "" : " + ") + std::to_string(n);
  spdlog::info("stage {} (layers {}): {:.2f} M parameters on this rank; device memory {:.1f} MiB (parameters {:.1f}, "
               "gradients {:.1f}, optimizer shard {:.1f}, activations {:.1f} in {}, pipeline buffers {:.1f}, ring buffers "
               "{:.1f}); host pool for offloaded activations {:.1f} MiB",
               coords.pp_rank, layers, engine.model().num_parameters() / 1e6, mib(memory.total()),
               mib(memory.parameters), mib(memory.gradients), mib(memory.optimizer), mib(memory.activations),
               dtype_name(engine.model().precision()),
               mib(memory.pipeline), mib(memory.ring), mib(memory.host_pool));
}

// Where training starts: a checkpoint to resume (weights, moments, step, data
// position), a checkpoint to take weights from, or fresh weights.
TrainingProgress restore_or_init(const Config& config, TrainingEngine& engine, int rank) {
  const TrainConfig& t = config.train;
  if (rank == 0 && (t.resume == ResumeMode::Auto || t.checkpoint_every > 0)) {
    for (const std::string& dir : manifestless_checkpoints(t.checkpoint_dir)) {
      spdlog::warn("{} has no manifest.yaml, so it is not a complete checkpoint: not resumed from and not deleted; a "
                   "checkpoint of its step moves it to {}.incomplete first. Look at it, then delete it or move it "
                   "out of train.checkpoint_dir", dir, dir);
    }
  }
  if (t.resume == ResumeMode::Auto) {
    if (auto latest = latest_checkpoint(t.checkpoint_dir)) {
      TrainingProgress progress = load_checkpoint(*latest, engine.model(), &engine.optimizer());
      spdlog::info("resumed from {} at step {}", *latest, progress.step);
      return progress;
    }
  }
  TrainingProgress progress;
  progress.train_seed = t.seed;
  progress.data_seed = config.data.seed;
  if (!t.init_from.empty()) {
    load_checkpoint(t.init_from, engine.model(), nullptr);
    spdlog::info("initial weights from {}", t.init_from);
  } else {
    engine.model().init_weights(t.seed);
  }
  return progress;
}

// Peak FLOP/s per training rank, the denominator of MFU: train.peak_flops if set;
// on a GPU of a known model its datasheet dense BF16 figure; else a measured fp32
// GEMM rate. CPU ranks sharing a node measure at the same time, each its share of
// the node, so every rank takes the mean over `world` (a collective).
double peak_flops_for_mfu(const TrainConfig& train, Device device, const ProcessInfo& process, Communicator& world,
                          int training_ranks) {
  const bool on_gpu = device == Device::CUDA;
  double peak_flops = train.peak_flops;
  if (peak_flops <= 0 && on_gpu) {
    peak_flops = gpu_bf16_peak_flops(cuda::device_description());
    if (process.rank == 0 && peak_flops > 0) {
      spdlog::info("peak: {:.0f} TFLOP/s dense BF16 (datasheet) per GPU for MFU", peak_flops / 1e12);
    }
  }
  if (peak_flops <= 0) {
    peak_flops = measure_gemm_flops(device);
    if (!on_gpu) peak_flops = world.all_reduce_sum(peak_flops) / training_ranks;
    if (process.rank == 0 && on_gpu) {
      spdlog::info("peak: {:.1f} TFLOP/s fp32 GEMM measured on this GPU (unknown model); set train.peak_flops to fix it",
                   peak_flops / 1e12);
    } else if (process.rank == 0) {
      spdlog::info("peak: {:.1f} GFLOP/s fp32 GEMM per rank measured, best of (rank 0) {}; set train.peak_flops "
                   "to fix it", peak_flops / 1e9, cpu_gemm_rates_summary());
    }
  }
  return peak_flops;
}

// ---- the steps ----

// Where a training rank's batches come from, produced a step or two ahead in the
// prefetch thread. Local: every rank samples the same sequences and makes the same
// plan, then reads only its own micro-batches; global batches recorded as bad
// (rollbacks, below) are drawn and dropped, on every rank alike. Remote: the
// loader's scheduler plans and the servers send this rank's tokens.
class BatchSource {
 public:
  BatchSource(const Config& config, const CostModel& cost, const TokenDataset& dataset, const SamplerState& start,
              const std::vector<SamplerState>& skipped, int hdp_rank)
      : config_(&config), dataset_(&dataset), hdp_rank_(hdp_rank), planner_(std::in_place, config, cost) {
    restart(start, skipped);
  }
  // The next `steps` batches from the loader; past them there is no work to wait for.
  BatchSource(RemoteBatchClient& loader, int64_t steps) {
    prefetcher_.emplace([&loader, remaining = steps]() mutable { return remaining-- > 0 ? loader.next() : GlobalBatch{}; },
                        2);
  }

  GlobalBatch next() { return prefetcher_->next(); }

  // Local only: whether restart() is possible.
  bool restartable() const { return dataset_ != nullptr; }
  // Drops the batches prefetched so far and goes on from `start`, skipping the
  // global batches that begin at one of `skipped`.
  void restart(const SamplerState& start, const std::vector<SamplerState>& skipped) {
    prefetcher_.reset();  // joins the prefetch thread before its sampler is replaced
    sampler_.emplace(*dataset_, sampler_options(config_->data), start);
    skipped_ = skipped;
    prefetcher_.emplace([this] { return next_local(); }, 2);
  }

 private:
  GlobalBatch next_local() {
    for (;;) {
      GlobalBatch batch = planner_->next_local_batch(*sampler_, *dataset_, hdp_rank_);
      if (std::find(skipped_.begin(), skipped_.end(), batch.start) == skipped_.end()) return batch;
    }
  }

  const Config* config_ = nullptr;         // local
  const TokenDataset* dataset_ = nullptr;  // local
  int hdp_rank_ = 0;
  std::optional<StepPlanner> planner_;   // local
  std::optional<BatchSampler> sampler_;  // local
  std::vector<SamplerState> skipped_;    // local: starts of the global batches to drop
  std::optional<BatchPrefetcher> prefetcher_;
};

// A training rank's steps after `progress.step` up to train.steps: each runs the
// next prefetched batch, records its metrics (rank 0 writes them) and, when due,
// writes a checkpoint.
class TrainingLoop {
 public:
  TrainingLoop(const Config& config, const ProcessInfo& process, ProcessGroups& groups, TrainingEngine& engine,
               BatchSource& batches, const TrainingProgress& progress, double peak_flops, size_t memory_bytes,
               const CheckpointDirLock* lock)
      : config_(config),
        lock_(lock),
        process_(process),
        groups_(groups),
        engine_(engine),
        batches_(batches),
        progress_(progress),
        peak_flops_(peak_flops),
        memory_bytes_(memory_bytes),
        layout_{config.parallel, groups.coords(), process.rank, &groups.world()},
        guard_(config.train.spike_factor, config.train.max_bad_steps),
        tracer_(config.trace, config.train.run_dir, groups.coords(), process.rank, groups.world()) {
    if (process.rank == 0) metrics_.emplace(config.train.run_dir, progress.step);
    fault_ = fault_injection_from_env();
    guard_.restore_window(progress.loss_window);
    if (config.train.checkpoint_every > 0) {
      // Writes in the background need MPI from a second thread when there are several ranks.
      const bool async = config.train.async_checkpoints && (process.thread_multiple || config.parallel.world() == 1);
      std::function<CheckpointHooks(int64_t)> hooks;
      if ((fault_.checkpoint || fault_.full_checkpoint) && fault_.rank == process.rank) {
        hooks = [rank = process.rank, fault = fault_](int64_t step) {
          CheckpointHooks h;
          if (step != fault.step) return h;
          if (fault.checkpoint) {
            h.after_part = [rank, step] {
              spdlog::critical("fault injection: rank {} exits abruptly while writing the checkpoint of step {}", rank,
                               step);
              std::_Exit(3);
            };
          } else {
            h.before_part = [rank, step](const std::string& file) {
              spdlog::warn("fault injection: rank {} writes its part of the checkpoint of step {} to a full disk ({} "
                           "-> /dev/full)", rank, step, file);
              std::filesystem::create_symlink("/dev/full", file);
            };
          }
          return h;
        };
      }
      writer_.emplace(config.train.checkpoint_dir, config.yaml, config.train.keep_checkpoints, layout_, async,
                      process.rank == 0, std::move(hooks));
    }
  }

  // Runs the steps; stops early, after a checkpoint, when a rank received a stop
  // signal (run/signals.h).
  void run() {
    // A rollback (below) moves next_step_ back.
    for (next_step_ = progress_.step + 1; next_step_ <= config_.train.steps && stop_signal_ == 0;) run_step(next_step_++);
    if (writer_) writer_->wait();  // the last checkpoint is complete before the run reports its end
  }

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
    double step_ms = 0;
    double data_wait_ms = 0;
    int64_t offloaded_bytes = 0;  // activations this rank copied to host memory
  };

  void run_step(int64_t step) {
    progress::set_step(step);
    if (writer_) writer_->check();  // an earlier background write's error ends the run here
    if (lock_) lock_->refresh();
    const bool fault_now = fault_.rank == process_.rank && fault_.step == step && fault_.exits();
    // Each poisoned step number once: a step rerun after a rollback is clean.
    const bool poison = fault_.rank == process_.rank && fault_.nan && step >= fault_.step && step <= fault_.last_step &&
                        step > last_poisoned_step_;
    if (fault_now && fault_.hang) {
      // A stopped process: no heartbeat, no answer, no exit (what a frozen node looks like).
      spdlog::critical("fault injection: rank {} stops itself (SIGSTOP) at step {}", process_.rank, step);
      spdlog::default_logger()->flush();
      ::kill(::getpid(), SIGSTOP);
    } else if (fault_now) {
      spdlog::critical("fault injection: rank {} exits abruptly at step {}", process_.rank, step);
      std::_Exit(3);
    }
    tracer_.begin(step);
    progress::Context step_context("training step");
    StepMeasurement measured;
    measured.step = step;
    const auto t0 = Clock::now();
    const GlobalBatch batch = [&] {
      TraceSpan wait(trace_ops::kDataWait.data());
      progress::Context context("data wait");
      return batches_.next();
    }();
    measured.data_wait_ms = ms_since(t0);
    measured.lr = learning_rate(config_.optim, step, config_.train.steps);
    groups_.tp().reset_stats();
    groups_.pp().reset_stats();
    groups_.hdp().reset_stats();
    if (Communicator* ep = groups_.ep()) {
      ep->reset_stats();
      groups_.expert_dp().reset_stats();
    }
    const int64_t offloaded_before = engine_.model().activation_usage().offloaded_bytes;
    StepOptions options;
    options.apply_update = [this](const StepResult& r) { return agree_on_update(r); };
    if (poison) {
      spdlog::warn("fault injection: rank {} poisons the loss of its first micro-batch at step {}", process_.rank, step);
      options.poisoned_micro_batch = 0;
      last_poisoned_step_ = step;
    }
    // AdamW's bias correction counts the updates applied, not the steps: a skipped
    // step must not advance it.
    measured.result = engine_.step(batch.local_micro_batches, measured.lr, step - progress_.skipped_steps, options);
    measured.step_ms = ms_since(t0);
    measured.offloaded_bytes = engine_.model().activation_usage().offloaded_bytes - offloaded_before;

    const StepMetrics m = step_metrics(measured, batch);
    if (metrics_ && fault_.full_metrics && fault_.rank == process_.rank && fault_.step == step) {
      spdlog::warn("fault injection: rank {} writes the metrics of step {} to a full disk ({} -> /dev/full)",
                   process_.rank, step, metrics_->path());
      metrics_->fail_writes_as_on_a_full_disk();
    }
    if (metrics_) metrics_->write(m);
    last_step_ = step;
    if (measured.result.updated) {
      streak_.clear();
    } else {
      streak_.push_back({step, batch.start, document_list(batch)});
      if (report_bad_step(step)) return;  // rolled back: the loop goes on after the checkpoint
    }
    if (process_.rank == 0 && (step % config_.train.log_every == 0 || step == 1 || step == config_.train.steps)) {
      log_step(m);
    }
    if (checkpoint_due(step)) {
      save_checkpoint_at(step, batch);
    } else if (stop_signal_ != 0 && step < config_.train.steps) {
      if (config_.train.checkpoint_every > 0) {
        save_checkpoint_at(step, batch);
      } else if (process_.rank == 0) {
        spdlog::warn("stopping without a checkpoint: train.checkpoint_every is 0 (checkpoints are off)");
      }
    }
    tracer_.end();
  }

  // Called by the engine on every rank once the step's loss and gradient norm are
  // known, before the update: one all-reduce (max) of this rank's verdict and of
  // whether it received a stop signal, so that every rank skips the same updates
  // and stops after the same step. Returns whether the update is applied.
  bool agree_on_update(const StepResult& result) {
    const StepFault mine = guard_.inspect(result.loss, result.grad_norm);
    std::array<int64_t, 3> flags = {mine == StepFault::NonFinite, mine == StepFault::Spike, stop_signal()};
    progress::Context context("bad-step and stop flags all-reduce");
    {
      TraceSpan span(trace_ops::kUpdateAgreement.data());
      if (span.tracer()) span.set_group(span.tracer()->world_group("agree"));
      groups_.world().all_reduce(std::span<int64_t>(flags), ReduceOp::Max);
    }
    stop_signal_ = static_cast<int>(flags[2]);
    step_fault_ = flags[0] ? StepFault::NonFinite : flags[1] ? StepFault::Spike : StepFault::None;
    fault_description_ = describe_fault(step_fault_, result.loss, result.grad_norm, config_.train.spike_factor, guard_.median());
    too_many_bad_ = guard_.record(step_fault_, result.loss);
    if (step_fault_ != StepFault::None) ++progress_.skipped_steps;
    return step_fault_ == StepFault::None;
  }

  // A step whose update was skipped: say why on rank 0, with the batch's
  // documents. At train.max_bad_steps in a row, roll back (every rank alike) to
  // the newest checkpoint before the streak and skip its global batches, or stop
  // when there is none. Returns true when it rolled back.
  bool report_bad_step(int64_t step) {
    if (process_.rank == 0) {
      spdlog::warn("step {}: update skipped ({}); global batch of {}; {} bad step(s) in a row (at "
                   "train.max_bad_steps = {} the run rolls back to the last checkpoint before them, or stops)",
                   step, fault_description_, streak_.back().documents, guard_.bad_in_a_row(),
                   config_.train.max_bad_steps);
    }
    if (!too_many_bad_) return false;
    const std::string what = "step " + std::to_string(step) + ": " + std::to_string(guard_.bad_in_a_row()) +
                             " bad step(s) in a row (train.max_bad_steps = " +
                             std::to_string(config_.train.max_bad_steps) + "; the last: " + fault_description_ + ")";
    std::string why_not;
    if (const auto target = rollback_target(&why_not)) {
      rollback(*target, what);
      return true;
    }
    throw std::runtime_error(what + "; stopping: " + why_not +
                             ". Lower optim.lr, check the data, or resume from the last checkpoint");
  }

  // The checkpoint a rollback of the current streak returns to: the newest one
  // before its first bad step (their updates were skipped, but the model may have
  // been drifting before the guard saw it). None, with the reason, when
  // checkpoints are off, the remote loader cannot replay batches, or rolling back
  // keeps ending in the same streak.
  std::optional<std::string> rollback_target(std::string* why_not) {
    const int64_t first_bad = streak_.front().step;
    if (config_.train.checkpoint_every == 0) {
      *why_not = "no checkpoint to roll back to (train.checkpoint_every is 0)";
      return std::nullopt;
    }
    if (!batches_.restartable()) {
      *why_not = "rollbacks need loader.mode local (the remote loader cannot replay batches)";
      return std::nullopt;
    }
    writer_->wait();  // the newest checkpoint may still be in the making
    auto target = latest_checkpoint_before(config_.train.checkpoint_dir, first_bad);
    if (!target) {
      *why_not = "no checkpoint before step " + std::to_string(first_bad) + " in " + config_.train.checkpoint_dir +
                 " to roll back to";
    } else if (*target == last_rollback_target_ && rollbacks_to_target_ >= kMaxRollbacksToOneCheckpoint) {
      *why_not = "rolled back to " + *target + " " + std::to_string(rollbacks_to_target_) +
                 " times and the bad steps persist (the model, not the data, looks broken)";
      target.reset();
    }
    return target;
  }

  // Loads `target` on every rank, records the streak's global batches as skipped
  // (in the checkpoint's manifest too, so that a run resumed from it skips them as
  // well) and goes on after it. Checkpoints newer than the target belong to the
  // abandoned trajectory and are deleted; so are their metrics lines. The
  // recovery recipe of PaLM (Chowdhery et al. 2022) and ByteRobust (ByteDance,
  // 2025): restart before the spike and skip the batches around it.
  void rollback(const std::string& target, const std::string& what) {
    std::vector<SamplerState> skipped = progress_.skipped_batches;
    std::string steps, documents;
    for (const BadStep& b : streak_) {
      if (std::find(skipped.begin(), skipped.end(), b.start) == skipped.end()) skipped.push_back(b.start);
      steps += (steps.empty() ? "" : ", ") + std::to_string(b.step);
      documents += (documents.empty() ? "" : "; ") + ("step " + std::to_string(b.step) + ": " + b.documents);
    }
    rollbacks_to_target_ = target == last_rollback_target_ ? rollbacks_to_target_ + 1 : 1;
    last_rollback_target_ = target;
    TrainingProgress restored = load_checkpoint(target, engine_.model(), &engine_.optimizer());
    restored.rollbacks = progress_.rollbacks + 1;
    restored.skipped_batches = skipped;
    if (process_.rank == 0) {
      spdlog::warn("{}; rolling back to {} (step {}) and skipping the global batches of step(s) {} from now on "
                   "(rollback {} of this run; {} skipped batch(es) in all): {}",
                   what, target, restored.step, steps, restored.rollbacks, skipped.size(), documents);
      delete_checkpoints_after(config_.train.checkpoint_dir, restored.step);
      record_rollbacks(target, restored.rollbacks, skipped);
    }
    // No rank goes on (and may write a checkpoint) before rank 0 has cleaned up.
    groups_.world().all_reduce_sum(int64_t{0});
    progress_ = restored;
    guard_.restore_window(restored.loss_window);
    guard_.reset_streak();
    streak_.clear();
    batches_.restart(restored.sampler, skipped);
    if (metrics_) metrics_.emplace(config_.train.run_dir, restored.step);
    next_step_ = restored.step + 1;
  }

  // "documents 3, 17, 18 (3 sequences)": the documents of a global batch, for logs.
  static std::string document_list(const GlobalBatch& batch) {
    constexpr size_t kShown = 16;
    std::vector<int64_t> ids;
    for (const SequenceSpan& s : batch.sequences) {
      if (std::find(ids.begin(), ids.end(), s.document) == ids.end()) ids.push_back(s.document);
    }
    std::string out = "documents ";
    for (size_t i = 0; i < ids.size() && i < kShown; ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    if (ids.size() > kShown) out += ", ... (" + std::to_string(ids.size()) + " documents)";
    return out + " (" + std::to_string(batch.sequences.size()) + " sequences)";
  }

  // The step's metrics record. A collective over the world: the job-wide figures
  // (ring traffic, offloaded bytes, every rank's measured and planned busy time)
  // are sums over the training ranks.
  StepMetrics step_metrics(const StepMeasurement& measured, const GlobalBatch& batch) {
    progress::Context context("metrics all-reduce");
    const int training_ranks = config_.parallel.world();
    Communicator& world = groups_.world();
    std::vector<int64_t> lengths;
    for (const SequenceSpan& s : batch.sequences) lengths.push_back(s.length);
    StepMetrics m;
    m.step = measured.step;
    m.loss = measured.result.loss;
    if (config_.model.moe()) {
      m.moe = true;
      m.aux_loss = measured.result.aux_loss;
      m.expert_tokens = measured.result.expert_tokens;
      int64_t total = 0, most = 0;
      for (int64_t n : m.expert_tokens) {
        total += n;
        most = std::max(most, n);
      }
      m.expert_load_max_over_mean =
          total > 0 ? static_cast<double>(most) * static_cast<double>(m.expert_tokens.size()) / total : 0.0;
    }
    m.lr = measured.lr;
    m.grad_norm = measured.result.grad_norm;
    m.tokens = measured.result.predictions;
    m.input_tokens = batch.tokens;
    m.micro_batches = static_cast<int64_t>(batch.local_micro_batches.size());
    for (const PackedMicroBatch& mb : batch.local_micro_batches) m.rank_tokens += mb.num_tokens();
    m.step_ms = measured.step_ms;
    m.time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    m.data_wait_ms = measured.data_wait_ms;
    m.tokens_per_s = batch.tokens / (measured.step_ms / 1e3);
    m.mfu = training_flops(config_.model.shape(), lengths) / (measured.step_ms / 1e3) / (peak_flops_ * training_ranks);
    m.peak_mem_bytes = static_cast<int64_t>(memory_bytes_);
    auto sent = [](const Communicator& c) { return c.stats().p2p_bytes + c.stats().collective_bytes; };
    m.tp_bytes = sent(groups_.tp());
    m.pp_bytes = sent(groups_.pp());
    // Expert parallelism: the experts' gradient reduction runs on their own
    // expert-data-parallel group, part of the data-parallel traffic.
    m.hdp_bytes = sent(groups_.hdp()) + (groups_.ep() ? sent(groups_.expert_dp()) : 0);
    m.ep_bytes = groups_.ep() ? sent(*groups_.ep()) : 0;
    std::vector<double> totals = {static_cast<double>(groups_.hdp().stats().p2p_bytes),
                                  static_cast<double>(measured.offloaded_bytes)};
    world.all_reduce(std::span<double>(totals), ReduceOp::Sum);
    m.busy_ms.assign(training_ranks, 0.0);
    m.planned_busy_ms.assign(training_ranks, 0.0);
    m.busy_ms[world.rank()] = measured.result.busy_ms;
    m.planned_busy_ms[world.rank()] = batch.planned_busy_s * 1e3;
    world.all_reduce(std::span<double>(m.busy_ms), ReduceOp::Sum);
    world.all_reduce(std::span<double>(m.planned_busy_ms), ReduceOp::Sum);
    m.attention_bytes = static_cast<int64_t>(totals[0]);
    m.offloaded_bytes = static_cast<int64_t>(totals[1]);
    m.busy_ms_max = *std::max_element(m.busy_ms.begin(), m.busy_ms.end());
    m.busy_ms_min = *std::min_element(m.busy_ms.begin(), m.busy_ms.end());
    const double busy_sum = std::accumulate(m.busy_ms.begin(), m.busy_ms.end(), 0.0);
    m.idle_fraction = std::max(0.0, 1.0 - busy_sum / training_ranks / measured.step_ms);
    m.planned_busy_ms_max = batch.planned_max_busy_s * 1e3;
    m.cost_model_error = m.planned_busy_ms_max > 0 ? (m.busy_ms_max - m.planned_busy_ms_max) / m.planned_busy_ms_max : 0;
    m.activation_peak_bytes = static_cast<int64_t>(engine_.model().activation_usage().device_peak_bytes);
    m.host_pool_bytes = static_cast<int64_t>(engine_.model().activation_usage().host_pool_bytes);
    m.skipped_steps = progress_.skipped_steps;
    m.rollbacks = progress_.rollbacks;
    m.skipped_batches = static_cast<int64_t>(progress_.skipped_batches.size());
    return m;
  }

  void log_step(const StepMetrics& m) const {
    spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | {:.0f} ms | mfu {:.1f}% | "
                 "busy {:.0f}-{:.0f} ms (planned max {:.0f}, cost model {:+.0f}%) idle {:.0f}%",
                 m.step, config_.train.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.step_ms, 100 * m.mfu,
                 m.busy_ms_min, m.busy_ms_max, m.planned_busy_ms_max, 100 * m.cost_model_error,
                 100 * m.idle_fraction);
  }

  bool checkpoint_due(int64_t step) const {
    return config_.train.checkpoint_every > 0 &&
           (step % config_.train.checkpoint_every == 0 || step == config_.train.steps);
  }

  // A collective over the world (checkpoint.h): the model, the optimizer, and the
  // sampler position after `batch`, so that a resumed run goes on with the next one.
  void save_checkpoint_at(int64_t step, const GlobalBatch& batch) {
    TraceSpan span(trace_ops::kCheckpoint.data());
    progress::Context context("checkpoint save");
    progress_.step = step;
    progress_.sampler = batch.next;
    progress_.loss_window = guard_.window();
    writer_->save(engine_.model(), engine_.optimizer(), progress_);
    if (process_.rank == 0) {
      spdlog::info("checkpoint for step {}: training waited {:.0f} ms ({})", step, writer_->last_blocking_ms(),
                   writer_->async() ? "state copied to host memory, writing in the background" : "written synchronously");
    }
  }

  const Config& config_;
  const CheckpointDirLock* lock_;  // rank 0 with checkpoints: refreshed every step
  const ProcessInfo& process_;
  ProcessGroups& groups_;
  TrainingEngine& engine_;
  BatchSource& batches_;
  TrainingProgress progress_;
  const double peak_flops_;
  const size_t memory_bytes_;  // the engine's device memory, reported as peak_mem_bytes
  const CheckpointLayout layout_;
  std::optional<MetricsWriter> metrics_;  // rank 0
  std::optional<CheckpointWriter> writer_;  // train.checkpoint_every > 0
  FaultInjection fault_;
  NumericalGuard guard_;
  StepTracer tracer_;  // the trace section (docs/tracing.md)
  // What the ranks agreed on for the current step (agree_on_update).
  StepFault step_fault_ = StepFault::None;
  std::string fault_description_;
  bool too_many_bad_ = false;  // max_bad_steps bad steps in a row
  int stop_signal_ = 0;        // a stop signal some rank received, agreed by all
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
  // Rollbacks in a row to the same checkpoint (a stop after kMaxRollbacksToOneCheckpoint).
  static constexpr int kMaxRollbacksToOneCheckpoint = 3;
  std::string last_rollback_target_;
  int rollbacks_to_target_ = 0;
};

}  // namespace

void run_training(const Config& config, const ProcessInfo& process) {
  progress::watch_this_thread();
  const ParallelDegrees& degrees = config.parallel;
  const bool remote = config.loader.mode == LoaderMode::Remote;
  const int loader_ranks = remote ? static_cast<int>(config.loader.servers) : 0;
  const int training_ranks = degrees.world();
  check_world_size(degrees, remote, loader_ranks, process);
  const int threads = configure_threads(config.train.threads, process);
  const Device device = config.train.device;
  if (device == Device::CUDA) {
    bind_gpu(config.train, process);
    if (config.model.moe() && process.rank == 0)
      spdlog::warn("model.arch: mixtral on cuda runs the MoE block's row-movement kernels (gather_rows, "
                   "combine_rows), which are unverified until `trainer selftest` passes on this GPU");
  }

  // With a remote loader the last ranks serve data; the others train on a
  // communicator of their own.
  std::unique_ptr<MessageChannel> channel;
  std::unique_ptr<MpiCommunicator> training_world;
  if (remote) {
    if (!process.thread_multiple) {
      throw std::runtime_error("loader.mode remote needs an MPI library with MPI_THREAD_MULTIPLE support");
    }
    channel = make_world_channel();
    training_world = split_roles(training_ranks);
    if (process.rank >= training_ranks) {
      run_loader_rank(config, process, *channel, training_ranks);
      return;
    }
  }
  check_output_directories(config, process.rank);
  // One run per checkpoint directory (checkpoint/lock.h): a lock while this job
  // writes there, and no continuing another run's checkpoints unless asked.
  std::optional<CheckpointDirLock> checkpoint_lock;
  if (config.train.checkpoint_every > 0 && process.rank == 0) {
    checkpoint_lock.emplace(config.train.checkpoint_dir, process.hostname, 2 * config.train.hang_timeout_s);
  }
  if (config.train.checkpoint_every > 0 || config.train.resume == ResumeMode::Auto) check_checkpoint_dir_run(config);
  // A signal stops a local-loader run at the next step boundary with a checkpoint.
  // Remote loader ranks plan every step up to train.steps and cannot stop early
  // yet, so there signals keep their default action (the job ends at once).
  if (!remote) install_stop_handlers(process.rank == 0);
  std::optional<TokenDataset> dataset;
  if (!remote) {
    dataset.emplace(TokenDataset::open(config.data.path, dataset_format(config.data)));
    validate_dataset_vocab(config, dataset->vocab_size(), dataset->max_token_id());
  }

  const CommBackend backend = choose_comm_backend(config, training_world.get(), process);
  ProcessGroups groups(degrees, config.model.tie_embeddings, std::move(training_world), backend);
  if (process.rank == 0) spdlog::info("tp, pp and hdp groups over {}", backend == CommBackend::Nccl ? "NCCL" : "MPI");
  const GridCoords& coords = groups.coords();
  spdlog::info("rank {} on {}: tp {} pp {} hdp {}; {} threads", process.rank, process.hostname, coords.tp_rank,
               coords.pp_rank, coords.hdp_rank, threads);
  if (process.rank == 0) log_job(config, dataset, degrees, loader_ranks);
  TrainingEngine engine(config, groups);
  const MemoryReport memory = engine.memory();
  log_stage(engine, memory, coords);

  const TrainingProgress progress = restore_or_init(config, engine, process.rank);
  std::optional<RemoteBatchClient> loader;
  if (remote) loader.emplace(*channel, training_ranks, training_ranks, loader_ranks, config.loader.timeout_s);
  if (progress.step >= config.train.steps) {
    if (loader) {
      if (process.rank == 0) channel->send(training_ranks, kLoaderHelloTag, encode_hello({progress.step, progress.sampler, {}}));
      loader->stop_servers();
    }
    spdlog::info("checkpoint step {} already reaches train.steps = {}; nothing to do", progress.step,
                 config.train.steps);
    return;
  }
  const double peak_flops = peak_flops_for_mfu(config.train, device, process, groups.world(), training_ranks);

  // Every rank plans with the same cost model (profiling, if asked for, is a
  // collective that averages the ranks' measurements); with a remote loader the
  // scheduler gets it from world rank 0.
  const CostModel cost =
      planner_cost_model(config, peak_flops, engine.model().saved_floats_per_token(), &groups.world());
  std::optional<BatchSource> batches;
  if (loader) {
    if (process.rank == 0) {
      channel->send(training_ranks, kLoaderHelloTag, encode_hello({progress.step, progress.sampler, cost}));
    }
    batches.emplace(*loader, config.train.steps - progress.step);
  } else {
    batches.emplace(config, cost, *dataset, progress.sampler, progress.skipped_batches, coords.hdp_rank);
  }

  std::optional<HangWatchdog> watchdog;
  if (config.train.hang_timeout_s > 0) {
    // Heartbeats travel from the watchdog thread, which needs MPI_THREAD_MULTIPLE;
    // without it each rank watches only itself.
    const auto* world = dynamic_cast<const MpiCommunicator*>(&groups.world());
    watchdog.emplace(HangWatchdogOptions{config.train.hang_timeout_s, config.train.run_dir, process.hostname, process.rank},
                     process.thread_multiple ? world : nullptr);
  }
  TrainingLoop loop(config, process, groups, engine, *batches, progress, peak_flops, memory.total(),
                    checkpoint_lock ? &*checkpoint_lock : nullptr);
  loop.run();
  watchdog.reset();
  if (loader) loader->stop_servers();
  if (device == Device::CUDA && cuda::op_times_enabled()) spdlog::info("rank {}: {}", process.rank, cuda::op_times_report());
  if (process.rank == 0 && loop.stopped_by() != 0) {
    spdlog::info("stopped by {} after step {} of {}; metrics in {}; run again with train.resume: auto to continue",
                 signal_name(loop.stopped_by()), loop.last_step(), config.train.steps, loop.metrics_path());
  } else if (process.rank == 0) {
    spdlog::info("training finished; metrics in {}", loop.metrics_path());
  }
}

}  // namespace hdp
