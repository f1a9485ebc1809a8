#pragma once
// HDP_FAULT_INJECT=RANK:STEP[-LAST][:hang|:nan|:ckpt|:full-metrics|:full-checkpoint|:slow-checkpoint|
// :defer-checkpoint|:held-checkpoint],
// read by the training loop
// (run/training_loop.cpp: that rank exits abruptly, without MPI_Finalize, when the
// step begins; with `:hang` it stops itself with SIGSTOP instead, a frozen
// process the hang watchdog must catch; with `:nan` the loss and gradients of
// its first micro-batch of each step STEP..LAST become NaN, once per step number
// (a step rerun after a rollback is not poisoned again), which the numerical
// guard must catch; with `:ckpt` it exits (_Exit) once its part of the
// checkpoint of step STEP is written and before the checkpoint is committed; with
// `:full-metrics` its metrics line of step STEP, with `:full-checkpoint` its
// checkpoint part of step STEP, goes to /dev/full, whose writes fail with ENOSPC
// as on a full disk; with `:slow-checkpoint` its checkpoint writer sleeps
// kSlowCheckpointMs before writing its part of the checkpoints of steps
// STEP..LAST, a slow disk; with `:defer-checkpoint` it finds a checkpoint over
// train.checkpoint_budget at steps STEP..LAST, so a due one is deferred past them
// (when the budget is not 0; a deferral without its timing); with `:held-checkpoint`
// its writer holds its part of the checkpoint of step STEP until the training
// thread has finished step LAST, giving up after kHeldCheckpointLimitS, and says how
// far training went meanwhile) and by the remote loader's servers (data/remote_loader.cpp:
// that rank exits abruptly, or with `:hang` stops answering, when asked for the
// tokens of step STEP). Tests use it to check that a job goes down promptly with
// a message, or survives bad steps. An injected exit has exit code
// kInjectedExitCode.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hdp {

// The exit code of an injected abrupt exit: 75 (EX_TEMPFAIL, "try again later"), outside
// the trainer's exit codes (trainer/command_line.h), so that a test tells it from every
// real outcome and `trainer supervise` restarts it as it restarts a crash.
inline constexpr int kInjectedExitCode = 75;

// `:slow-checkpoint`: how long the writer sleeps before writing a part.
inline constexpr int kSlowCheckpointMs = 1000;

// `:held-checkpoint`: the longest the writer holds a part for the training thread
// (a training thread that waits for the write would never come).
inline constexpr int kHeldCheckpointLimitS = 60;

struct FaultInjection {
  int rank = -1;      // -1: no fault injected
  int64_t step = -1;
  int64_t last_step = -1;  // `:nan` poisons steps [step, last_step]; = step unless a range is given
  bool hang = false;  // `:hang`: stop (training rank) or stop answering (loader rank) instead of exiting
  bool nan = false;   // `:nan`: a training rank poisons a micro-batch instead of exiting
  bool checkpoint = false;  // `:ckpt`: a training rank exits while writing the checkpoint of that step
  bool full_metrics = false;     // `:full-metrics`: its metrics line of that step meets a full disk
  bool full_checkpoint = false;  // `:full-checkpoint`: its checkpoint part of that step meets a full disk
  bool slow_checkpoint = false;  // `:slow-checkpoint`: its checkpoint parts of steps STEP..LAST are slow to write
  bool defer_checkpoint = false;  // `:defer-checkpoint`: it defers the due checkpoints of steps STEP..LAST
  bool held_checkpoint = false;   // `:held-checkpoint`: its writer holds step STEP's part until step LAST is done
  // Whether `:defer-checkpoint` defers a checkpoint of rank on_rank at step at_step.
  bool defers_checkpoint(int on_rank, int64_t at_step) const {
    return defer_checkpoint && on_rank == rank && at_step >= step && at_step <= last_step;
  }
  // The fault is an abrupt exit at STEP (a stop with `hang`), no other mode.
  bool exits() const {
    return !nan && !checkpoint && !full_metrics && !full_checkpoint && !slow_checkpoint && !defer_checkpoint &&
           !held_checkpoint;
  }
};

// The fault HDP_FAULT_INJECT asks for; none when it is unset. Throws
// std::invalid_argument when it is set but not RANK:STEP[-LAST][:MODE].
inline FaultInjection fault_injection_from_env() {
  FaultInjection f;
  const char* spec = std::getenv("HDP_FAULT_INJECT");
  if (spec == nullptr) return f;
  auto bad = [spec] {
    throw std::invalid_argument(std::string("HDP_FAULT_INJECT='") + spec +
                                "': expected RANK:STEP[-LAST][:hang|:nan|:ckpt|:full-metrics|:full-checkpoint|"
                                ":slow-checkpoint|:defer-checkpoint|:held-checkpoint]");
  };
  char* end = nullptr;
  const char* p = spec;
  const long rank = std::strtol(p, &end, 10);
  if (end == p || *end != ':') bad();
  p = end + 1;
  const long long step = std::strtoll(p, &end, 10);
  if (end == p || step < 0) bad();
  p = end;
  long long last = step;
  if (*p == '-') {
    ++p;
    last = std::strtoll(p, &end, 10);
    if (end == p || last < step) bad();
    p = end;
  }
  std::string mode;
  if (*p == ':') {
    mode = p + 1;
  } else if (*p != '\0') {
    bad();
  }
  if (!(mode.empty() || mode == "hang" || mode == "nan" || mode == "ckpt" || mode == "full-metrics" ||
        mode == "full-checkpoint" || mode == "slow-checkpoint" || mode == "defer-checkpoint" ||
        mode == "held-checkpoint"))
    bad();
  f.rank = static_cast<int>(rank);
  f.step = step;
  f.last_step = last;
  f.hang = mode == "hang";
  f.nan = mode == "nan";
  f.checkpoint = mode == "ckpt";
  f.full_metrics = mode == "full-metrics";
  f.full_checkpoint = mode == "full-checkpoint";
  f.slow_checkpoint = mode == "slow-checkpoint";
  f.defer_checkpoint = mode == "defer-checkpoint";
  f.held_checkpoint = mode == "held-checkpoint";
  return f;
}

}  // namespace hdp
