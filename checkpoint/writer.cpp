#include "checkpoint/writer.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <utility>

#include "parallel/progress.h"

namespace hdp {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The CPU time of the calling thread (user and kernel), in ms: what a background
// write takes from the cores, which its wall time under nice 19 does not show.
double thread_cpu_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// The background write (HDF5, the checksums) runs on the cores that train. At the
// lowest priority (nice 19; Linux keeps a nice value per thread, and threads this
// one starts inherit it) it takes what the training threads leave idle instead of
// a fair share of their time; a step waits for it only when the next checkpoint
// is due before it is done.
void yield_the_cores_to_training() {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string checkpoint_dir, std::string config_yaml, int64_t keep,
                                   const CheckpointLayout& layout, bool async, bool announce,
                                   std::function<CheckpointHooks(int64_t)> hooks,
                                   std::optional<TokenizerFiles> tokenizer)
    : checkpoint_dir_(std::move(checkpoint_dir)),
      config_yaml_(std::move(config_yaml)),
      keep_(keep),
      layout_(layout),
      async_(async),
      announce_(announce),
      hooks_(std::move(hooks)),
      tokenizer_(std::move(tokenizer)) {
  if (async_ && layout.world != nullptr && layout.world->size() > 1) {
    const auto* world = dynamic_cast<const MpiCommunicator*>(layout.world);
    if (world == nullptr) throw std::logic_error("CheckpointWriter: asynchronous writes need an MPI world");
    // A communicator only the writer threads use: their commit collectives run
    // while the training threads run theirs on the world.
    commit_world_ = world->split(0, world->rank(), "checkpoint");
    layout_.world = commit_world_.get();
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  if (std::uncaught_exceptions() > 0 && commit_world_) {
    // The job is going down: this rank logs and aborts next. Joining could wait
    // forever for a peer's commit collective; the abort ends the thread with the
    // process. A single rank has no peer to wait for, and joins: a thread left
    // writing HDF5 while the process exits would crash in the library's clean-up.
    thread_.detach();
    return;
  }
  thread_.join();
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      spdlog::error("checkpoint write failed: {}", e.what());
    }
  }
}

void CheckpointWriter::save(const LlamaModel& model, const ZeroAdamW& optimizer, const TrainingProgress& progress) {
  progress::Context context("checkpoint save");
  const auto t0 = Clock::now();
  join_and_rethrow();  // one snapshot buffer: the previous write must be done with it
  take_snapshot(model, optimizer, progress, layout_, snapshot_);
  const int64_t step = progress.step;
  last_blocking_ms_ = ms_since(t0);
  if (async_) {
    done_.store(false, std::memory_order_release);
    thread_ = std::thread([this, step, blocking_ms = last_blocking_ms_] {
      yield_the_cores_to_training();
      write(step, blocking_ms);
    });
  } else {
    write(step, last_blocking_ms_);
    join_and_rethrow();
    last_blocking_ms_ = ms_since(t0);
    last_cost_ms_.store(last_blocking_ms_, std::memory_order_release);  // the whole write's wall time
  }
}

void CheckpointWriter::wait() {
  progress::Context context("checkpoint wait");
  join_and_rethrow();
}

void CheckpointWriter::check() {
  if (done_.load(std::memory_order_acquire)) join_and_rethrow();
}

void CheckpointWriter::write(int64_t step, double blocking_ms) {
  try {
    const auto t0 = Clock::now();
    const double cpu0 = thread_cpu_ms();
    const CheckpointHooks hooks = hooks_ ? hooks_(step) : CheckpointHooks{};
    const std::string path = save_checkpoint(checkpoint_dir_, snapshot_, config_yaml_, keep_, layout_, hooks,
                                               tokenizer_ ? &*tokenizer_ : nullptr);
    const double cpu_ms = thread_cpu_ms() - cpu0;
    if (async_) last_cost_ms_.store(blocking_ms + cpu_ms, std::memory_order_release);
    if (announce_) {
      spdlog::info("checkpoint {} written in {:.0f} ms ({:.0f} ms of CPU){}", path, ms_since(t0), cpu_ms,
                   async_ ? " (in the background)" : "");
    }
  } catch (...) {
    error_ = std::current_exception();
  }
  done_.store(true, std::memory_order_release);
}

void CheckpointWriter::join_and_rethrow() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
}

}  // namespace hdp
