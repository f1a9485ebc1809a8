#include "run/training_loop.h"

#include <spdlog/spdlog.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>

#include "checkpoint/directory.h"
#include "checkpoint/protocol.h"
#include "data/dataset.h"
#include "kernels/cuda/cuda_runtime.h"
#include "model/lr_schedule.h"
#include "parallel/phase.h"
#include "parallel/progress.h"
#include "run/signals.h"
#include "spec/model_shape.h"

namespace hdp {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// "documents 3, 17, 18 (3 sequences)": the documents of a global batch, for logs.
std::string document_list(const GlobalBatch& batch) {
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

// HDP_FAULT_INJECT=RANK:STEP:ckpt, RANK:STEP:full-checkpoint,
// RANK:STEP[-LAST]:slow-checkpoint and RANK:STEP-LAST:held-checkpoint on this rank: the
// checkpoint writer's hooks that exit between writing the part and the commit, put
// the part on /dev/full, sleep before writing it, or hold it until the training
// thread has finished step LAST (`finished`: the last step it finished). Empty (no
// hooks) for every other rank and fault.
std::function<CheckpointHooks(int64_t)> checkpoint_fault_hooks(const FaultInjection& fault, int rank,
                                                               const std::atomic<int64_t>* finished) {
  if (!(fault.checkpoint || fault.full_checkpoint || fault.slow_checkpoint || fault.held_checkpoint) ||
      fault.rank != rank)
    return {};
  return [rank, fault, finished](int64_t step) {
    CheckpointHooks h;
    if (fault.held_checkpoint) {
      if (step != fault.step) return h;
      h.before_part = [rank, step, last = fault.last_step, finished](const std::string&) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(kHeldCheckpointLimitS);
        while (finished->load() < last && std::chrono::steady_clock::now() < give_up)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const int64_t reached = finished->load();
        spdlog::warn("fault injection: rank {} held its part of the checkpoint of step {} while the training thread "
                     "finished {} steps (up to step {})",
                     rank, step, reached - step, reached);
      };
      return h;
    }
    if (fault.slow_checkpoint) {
      if (step < fault.step || step > fault.last_step) return h;
      h.before_part = [rank, step](const std::string&) {
        spdlog::warn("fault injection: rank {} sleeps {} ms before writing its part of the checkpoint of step {}",
                     rank, kSlowCheckpointMs, step);
        std::this_thread::sleep_for(std::chrono::milliseconds(kSlowCheckpointMs));
      };
      return h;
    }
    if (step != fault.step) return h;
    if (fault.checkpoint) {
      h.after_part = [rank, step] {
        spdlog::critical("fault injection: rank {} exits abruptly while writing the checkpoint of step {}", rank, step);
        std::_Exit(kInjectedExitCode);
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

}  // namespace

TrainingLoop::TrainingLoop(const Config& config, const ProcessInfo& process, ProcessGroups& groups,
                           TrainingEngine& engine, BatchSource& batches, const TrainingProgress& progress,
                           double peak_flops, size_t memory_bytes, std::vector<const DirectoryLock*> locks)
    : config_(config),
      locks_(std::move(locks)),
      process_(process),
      groups_(groups),
      engine_(engine),
      batches_(batches),
      progress_(progress),
      peak_flops_(peak_flops),
      memory_bytes_(memory_bytes),
      layout_{config.parallel, groups.coords(), process.rank, &groups.world()},
      checkpoint_dir_(resolved_checkpoint_dir(config.train)),
      guard_(SpikeFactors{config.train.spike_factor, config.train.grad_norm_spike_factor}, config.train.max_bad_steps),
      tracer_(config.trace, config.train.run_dir, groups.coords(), process.rank, groups.world()) {
  if (process.rank == 0) metrics_.emplace(config.train.run_dir, progress.step);
  if (process.rank == 0 && config.metrics.tensorboard) {
    tensorboard_.emplace(config.train.run_dir, process.hostname, progress.step);
  }
  fault_ = fault_injection_from_env();
  guard_.restore_windows(progress.loss_window, progress.grad_norm_window);
  // A checkpoint resumed from before the guard was warm awaits confirmation.
  awaiting_confirmation_ = !guard_.warm();
  if (config.train.checkpoint_every > 0) {
    // Writes in the background need MPI from a second thread when there are several ranks.
    const bool async = config.train.async_checkpoints && (process.thread_multiple || config.parallel.world() == 1);
    // Rank 0 commits every checkpoint with a copy of the data's tokenizer (checkpoint/tokenizer_copy.h).
    std::optional<TokenizerFiles> tokenizer;
    if (process.rank == 0) tokenizer = dataset_tokenizer_copy(config.data.path, dataset_format(config.data));
    writer_.emplace(checkpoint_dir_, config.yaml, config.train.keep_checkpoints, layout_, async,
                    process.rank == 0, checkpoint_fault_hooks(fault_, process.rank, &finished_step_),
                    std::move(tokenizer));
  }
}

void TrainingLoop::run() {
  clock_ = ProgressMeter();
  first_step_ = progress_.step;
  // A rollback (below) moves next_step_ back.
  for (next_step_ = progress_.step + 1; next_step_ <= config_.train.steps && stop_signal_ == 0;) run_step(next_step_++);
  if (writer_) writer_->wait();  // the last checkpoint is complete before the run reports its end
}

void TrainingLoop::run_step(int64_t step) {
  progress::set_step(step);
  if (writer_) writer_->check();  // an earlier background write's error ends the run here
  for (const DirectoryLock* lock : locks_) lock->refresh();
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
    std::_Exit(kInjectedExitCode);
  }
  tracer_.begin(step);
  progress::Context step_context("training step");
  StepMeasurement measured;
  measured.step = step;
  const auto t0 = Clock::now();
  const GlobalBatch batch = [&] {
    Phase phase(trace_ops::kDataWait.data(), "data wait");
    return batches_.next();
  }();
  measured.data_wait_ms = ms_since(t0);
  measured.lr = learning_rate(config_.optim, step, config_.train.steps);
  groups_.tp().reset_stats();
  groups_.pp().reset_stats();
  groups_.hdp().reset_stats();
  groups_.gradients().reset_stats();
  if (Communicator* ep = groups_.ep()) {
    ep->reset_stats();
    groups_.expert_dp().reset_stats();
  }
  const int64_t offloaded_before = engine_.model().activation_usage().offloaded_bytes;
  int poisoned_micro_batch = -1;
  if (poison) {
    spdlog::warn("fault injection: rank {} poisons the loss of its first micro-batch at step {}", process_.rank, step);
    poisoned_micro_batch = 0;
    last_poisoned_step_ = step;
  }
  measured.result = engine_.forward_backward(batch.local_micro_batches, poisoned_micro_batch);
  // AdamW's bias correction counts the updates applied, not the steps: a skipped
  // step must not advance it (agree_on_update counts it after this number is taken).
  const int64_t update_number = step - progress_.skipped_steps;
  measured.updated = agree_on_update(measured.result, step);
  if (measured.updated) {
    newest_good_step_ = step;
    confirm_checkpoints_once_warm();
    engine_.apply_update(measured.lr, update_number);
  }
  measured.step_ms = ms_since(t0);
  const bool save = measured.updated && checkpoint_now(step, measured.step_ms);
  measured.offloaded_bytes = engine_.model().activation_usage().offloaded_bytes - offloaded_before;

  const StepMetrics m = step_metrics(measured, batch);
  if (metrics_ && fault_.full_metrics && fault_.rank == process_.rank && fault_.step == step) {
    spdlog::warn("fault injection: rank {} writes the metrics of step {} to a full disk ({} -> /dev/full)",
                 process_.rank, step, metrics_->path());
    metrics_->fail_writes_as_on_a_full_disk();
  }
  if (metrics_) metrics_->write(m);
  if (tensorboard_) tensorboard_->write(m);
  last_step_ = step;
  finished_step_.store(step);
  if (measured.updated) {
    streak_.clear();
  } else {
    streak_.push_back({step, batch.start, document_list(batch)});
    if (report_bad_step(step)) return;  // rolled back: the loop goes on after the checkpoint
  }
  if (process_.rank == 0 && (step % config_.train.log_every == 0 || step == 1 || step == config_.train.steps)) {
    log_step(m);
  }
  // The per-op device times (HDP_CUDA_OP_TIMES=1) leave out the first step's one-time work.
  if (config_.train.device == Device::CUDA && step == first_step_ + 1 && step < config_.train.steps)
    cuda::op_times_reset();
  const bool wants_checkpoint = checkpoint_due(step) || (stop_signal_ != 0 && config_.train.checkpoint_every > 0);
  if (save) {
    save_checkpoint_at(step, batch);
  } else if (wants_checkpoint && !measured.updated) {
    // Its weights are the ones that produced the bad step: a checkpoint of them
    // would be the first place a rollback or a restart returns to.
    if (process_.rank == 0) spdlog::warn("step {}: no checkpoint of a step the numerical guard flagged", step);
  } else if (stop_signal_ != 0 && step < config_.train.steps && config_.train.checkpoint_every == 0 &&
             process_.rank == 0) {
    spdlog::warn("stopping without a checkpoint: train.checkpoint_every is 0 (checkpoints are off)");
  }
  tracer_.end();
}

bool TrainingLoop::agree_on_update(const StepResult& result, int64_t step) {
  // The most severe verdict of any rank (StepFault is ordered by severity).
  // The checkpoint cost in whole microseconds, rounded up, so that the maximum is exact.
  std::array<int64_t, 4> flags = {static_cast<int64_t>(guard_.inspect(result.loss, result.grad_norm)), stop_signal(),
                                  writer_ && !checkpoint_within_budget(step) ? 1 : 0,
                                  writer_ ? static_cast<int64_t>(std::ceil(writer_->cost_ms() * 1e3)) : 0};
  {
    Phase phase(trace_ops::kUpdateAgreement.data(), "bad-step, stop and checkpoint-budget flags all-reduce");
    if (phase.tracer()) phase.set_group(phase.tracer()->world_group("agree"));
    groups_.world().all_reduce(std::span<int64_t>(flags), ReduceOp::Max);
  }
  stop_signal_ = static_cast<int>(flags[1]);
  checkpoint_over_budget_ = flags[2] != 0;
  checkpoint_cost_ms_ = static_cast<double>(flags[3]) / 1e3;
  step_fault_ = static_cast<StepFault>(flags[0]);
  fault_description_ = guard_.describe(step_fault_, result.loss, result.grad_norm);
  too_many_bad_ = guard_.record(step_fault_, result.loss, result.grad_norm);
  if (step_fault_ != StepFault::None) ++progress_.skipped_steps;
  return step_fault_ == StepFault::None;
}

bool TrainingLoop::report_bad_step(int64_t step) {
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
  throw DivergenceError("the run diverges: " + what + "; stopping: " + why_not +
                        ". Lower optim.lr, check the data, or resume from an earlier checkpoint");
}

std::optional<std::string> TrainingLoop::rollback_target(std::string* why_not) {
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
  const std::string& dir = checkpoint_dir_;
  int64_t before = first_bad;
  if (last_rollback_ && newest_good_step_ <= last_rollback_->last_bad_step) {
    // Bad steps again before the run got past the streak that sent it back: the
    // weights it returned to, not the skipped batches, look bad.
    const Rollback& last = *last_rollback_;
    const std::string why = "a rollback to it (bad steps " + std::to_string(last.first_bad_step) + "-" +
                            std::to_string(last.last_bad_step) + ") ran into bad steps again from step " +
                            std::to_string(first_bad) + ", before passing step " + std::to_string(last.last_bad_step);
    suspect_steps_.push_back(last.target_step);
    if (process_.rank == 0) {
      const int newer = mark_suspect_from(dir, last.target_step, why);
      spdlog::warn("{} is suspect: {}; so are the {} checkpoint(s) trained from it; rolling back past them",
                   last.target, why, newer);
    }
    before = last.target_step;
  }
  std::vector<std::string> passed_by;
  auto target = rollback_checkpoint_before(dir, before, suspect_steps_, &passed_by);
  std::string passed;
  for (const std::string& p : passed_by) passed += (passed.empty() ? "" : "; ") + p;
  if (!target) {
    *why_not = "no confirmed checkpoint before step " + std::to_string(before) + " in " + dir + " to roll back to" +
               (passed.empty() ? "" : " (passed by: " + passed + ")");
  } else if (process_.rank == 0 && !passed.empty()) {
    spdlog::warn("rolling back past {}", passed);
  }
  return target;
}

void TrainingLoop::rollback(const std::string& target, const std::string& what) {
  std::vector<SamplerState> skipped = progress_.skipped_batches;
  std::string steps, documents;
  for (const BadStep& b : streak_) {
    if (std::find(skipped.begin(), skipped.end(), b.start) == skipped.end()) skipped.push_back(b.start);
    steps += (steps.empty() ? "" : ", ") + std::to_string(b.step);
    documents += (documents.empty() ? "" : "; ") + ("step " + std::to_string(b.step) + ": " + b.documents);
  }
  TrainingProgress restored = load_checkpoint(target, engine_.model(), &engine_.optimizer());
  last_rollback_ = Rollback{target, restored.step, streak_.front().step, streak_.back().step};
  restored.rollbacks = progress_.rollbacks + 1;
  restored.skipped_batches = skipped;
  if (process_.rank == 0) {
    spdlog::warn("{}; rolling back to {} (step {}) and skipping the global batches of step(s) {} from now on "
                 "(rollback {} of this run; {} skipped batch(es) in all): {}",
                 what, target, restored.step, steps, restored.rollbacks, skipped.size(), documents);
    delete_checkpoints_after(checkpoint_dir_, restored.step);
    record_rollbacks(target, restored.rollbacks, skipped);
  }
  // No rank goes on (and may write a checkpoint) before rank 0 has cleaned up.
  groups_.world().all_reduce_sum(int64_t{0});
  progress_ = restored;
  guard_.restore_windows(restored.loss_window, restored.grad_norm_window);
  guard_.reset_streak();
  newest_good_step_ = restored.step;
  awaiting_confirmation_ = !guard_.warm();
  streak_.clear();
  checkpoint_deferred_ = false;  // it belonged to the abandoned trajectory
  deferral_reported_ = false;
  batches_.restart(restored.sampler, skipped);
  if (metrics_) metrics_.emplace(config_.train.run_dir, restored.step);
  if (tensorboard_) tensorboard_->restart_after(restored.step);
  next_step_ = restored.step + 1;
}

StepMetrics TrainingLoop::step_metrics(const StepMeasurement& measured, const GlobalBatch& batch) {
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
  // The data-parallel traffic: ring attention's on hdp, ZeRO-1's on its own copy of
  // hdp and, under expert parallelism, the experts' on their expert-data-parallel group.
  m.hdp_bytes = sent(groups_.hdp()) + sent(groups_.gradients()) + (groups_.ep() ? sent(groups_.expert_dp()) : 0);
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
  m.planned_bound_ms = batch.planned_bound_s * 1e3;
  m.cost_model_error = m.planned_busy_ms_max > 0 ? (m.busy_ms_max - m.planned_busy_ms_max) / m.planned_busy_ms_max : 0;
  m.planned_step_ms = batch.planned_step_s * 1e3;
  // A plan whose rings the simulator finds deadlocked has no simulated step (written
  // as null), and so no error.
  m.planned_step_error =
      std::isfinite(m.planned_step_ms) && m.planned_step_ms > 0 ? m.step_ms / m.planned_step_ms - 1 : 0;
  m.activation_peak_bytes = static_cast<int64_t>(engine_.model().activation_usage().device_peak_bytes);
  m.host_pool_bytes = static_cast<int64_t>(engine_.model().activation_usage().host_pool_bytes);
  m.skipped_steps = progress_.skipped_steps;
  m.rollbacks = progress_.rollbacks;
  m.checkpoints_deferred = progress_.checkpoints_deferred;
  m.skipped_batches = static_cast<int64_t>(progress_.skipped_batches.size());
  return m;
}

void TrainingLoop::log_step(const StepMetrics& m) const {
  // The time left at this run's pace so far (its steps, not the ones before a resume).
  const double done = static_cast<double>(m.step - first_step_) / static_cast<double>(config_.train.steps - first_step_);
  spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | {:.0f} ms | mfu {:.1f}% | "
               "busy {:.0f}-{:.0f} ms (planned max {:.0f}, cost model {:+.0f}%) idle {:.0f}% | simulated step {:.0f} "
               "ms ({:+.0f}%) | {}",
               m.step, config_.train.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.step_ms, 100 * m.mfu,
               m.busy_ms_min, m.busy_ms_max, m.planned_busy_ms_max, 100 * m.cost_model_error,
               100 * m.idle_fraction, m.planned_step_ms, 100 * m.planned_step_error, clock_.elapsed_and_left(done));
}

bool TrainingLoop::checkpoint_due(int64_t step) const {
  return config_.train.checkpoint_every > 0 &&
         (step % config_.train.checkpoint_every == 0 || step == config_.train.steps);
}

bool TrainingLoop::checkpoint_now(int64_t step, double step_ms) {
  if (config_.train.checkpoint_every == 0) return false;
  const bool due = checkpoint_due(step);
  if (!due && !checkpoint_deferred_ && stop_signal_ == 0) return false;
  const bool must = step == config_.train.steps || stop_signal_ != 0;
  if (must || !checkpoint_over_budget_) {
    // A deferral that ends before rank 0's own write did (its steps all came while that
    // write ran) is said as it ends, with the write's cost now known.
    if (checkpoint_deferred_ && !deferral_reported_ && process_.rank == 0) report_deferral(step, step_ms);
    checkpoint_deferred_ = false;
    deferral_reported_ = false;
    return true;
  }
  if (due) ++progress_.checkpoints_deferred;
  // Said once the previous write is done: until then its cost is only its wait, which
  // would put the interval far too short.
  if (!deferral_reported_ && process_.rank == 0 && !writer_->writing()) {
    report_deferral(step, step_ms);
    deferral_reported_ = true;
  }
  checkpoint_deferred_ = true;
  return false;
}

bool TrainingLoop::checkpoint_within_budget(int64_t step) const {
  const double budget = config_.train.checkpoint_budget;
  if (budget > 0 && fault_.defers_checkpoint(process_.rank, step)) return false;  // HDP_FAULT_INJECT
  // Not while a write is in flight: its cost is not known yet (the first one's is only its
  // wait so far), and a save now would block on the rest of it, outside the budget.
  return budget == 0 ||
         (!writer_->writing() && ms_since(last_checkpoint_start_) * budget >= writer_->cost_ms());
}

void TrainingLoop::report_deferral(int64_t step, double step_ms) {
  // The cost agreed this step may predate the end of the write just finished: take that
  // write's own, now known, where it is larger.
  const double cost_ms = std::max(checkpoint_cost_ms_, writer_->cost_ms());
  const double interval_ms = cost_ms / config_.train.checkpoint_budget;
  const int64_t every = std::max<int64_t>(
      config_.train.checkpoint_every,
      static_cast<int64_t>(std::ceil(interval_ms / std::max(step_ms, 1e-3))));
  if (reported_interval_steps_ > 0 && every < 2 * reported_interval_steps_ && 2 * every > reported_interval_steps_) {
    return;
  }
  reported_interval_steps_ = every;
  spdlog::info("step {}: checkpoint deferred: one costs this run about {:.0f} ms (the training thread's wait and the "
               "writer's CPU time), and train.checkpoint_budget {} allows one every {:.1f} s: about every {} steps at "
               "this pace, so a failure loses at most about {} steps (`checkpoints_deferred` in the metrics counts "
               "the due checkpoints passed over)",
               step, cost_ms, config_.train.checkpoint_budget, interval_ms / 1e3, every, 2 * every);
}

void TrainingLoop::confirm_checkpoints_once_warm() {
  if (!awaiting_confirmation_ || !guard_.warm()) return;
  awaiting_confirmation_ = false;
  if (process_.rank != 0 || !writer_) return;
  writer_->wait();  // rare (the step the guard turns warm): the write in flight may be one to confirm
  for (const std::string& path : confirm_checkpoints(checkpoint_dir_)) {
    spdlog::info("{} confirmed: the numerical guard passed a step after it", path);
  }
}

void TrainingLoop::save_checkpoint_at(int64_t step, const GlobalBatch& batch) {
  Phase phase(trace_ops::kCheckpoint.data(), "checkpoint save");
  progress_.step = step;
  progress_.sampler = batch.next;
  progress_.loss_window = guard_.loss_window();
  progress_.grad_norm_window = guard_.grad_norm_window();
  progress_.guard_confirmed = guard_.warm();
  awaiting_confirmation_ = awaiting_confirmation_ || !progress_.guard_confirmed;
  progress_.lr_schedule = RunSchedule{config_.optim, config_.train.steps};
  last_checkpoint_start_ = Clock::now();
  writer_->save(engine_.model(), engine_.optimizer(), progress_);
  if (process_.rank == 0) {
    spdlog::info("checkpoint for step {}: training waited {:.0f} ms ({})", step, writer_->last_blocking_ms(),
                 writer_->async() ? "state copied to host memory, writing in the background" : "written synchronously");
  }
}

}  // namespace hdp
