#include "run/training.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <stdexcept>

#include "data/remote_loader.h"
#include "kernels/cuda/cuda_runtime.h"
#include "parallel/message_channel.h"
#include "parallel/process_groups.h"
#include "parallel/progress.h"
#include "run/batch_source.h"
#include "run/hang_watchdog.h"
#include "run/job.h"
#include "run/loader_roles.h"
#include "run/planner_cost.h"
#include "run/signals.h"
#include "run/training_loop.h"

namespace hdp {

void run_training(const Config& config, const ProcessInfo& process) {
  progress::watch_this_thread();
  const bool remote = config.loader.mode == LoaderMode::Remote;
  const int loader_ranks = remote ? static_cast<int>(config.loader.servers) : 0;
  const int training_ranks = config.parallel.world();
  const int threads = set_up_process(config, process);

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
  TrainingJob job(config, process, std::move(training_world), threads);
  const TrainingProgress& progress = job.start();
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
  const Device device = config.train.device;
  const double peak_flops = peak_flops_for_mfu(config.train, device, process, job.groups().world(), training_ranks);

  // Every rank plans with the same cost model (profiling, if asked for, is a
  // collective that averages the ranks' measurements); with a remote loader the
  // scheduler gets it from world rank 0.
  const CostModel cost =
      planner_cost_model(config, peak_flops, job.engine().model().saved_floats_per_token(), &job.groups().world());
  std::optional<BatchSource> batches;
  if (loader) {
    if (process.rank == 0) {
      channel->send(training_ranks, kLoaderHelloTag, encode_hello({progress.step, progress.sampler, cost}));
    }
    batches.emplace(*loader, config.train.steps - progress.step);
  } else {
    batches.emplace(config, cost, *job.dataset(), progress.sampler, progress.skipped_batches,
                    job.groups().coords().hdp_rank);
  }

  std::optional<HangWatchdog> watchdog;
  if (config.train.hang_timeout_s > 0) {
    // Heartbeats travel from the watchdog thread, which needs MPI_THREAD_MULTIPLE;
    // without it each rank watches only itself.
    const auto* world = dynamic_cast<const MpiCommunicator*>(&job.groups().world());
    watchdog.emplace(HangWatchdogOptions{config.train.hang_timeout_s, config.train.run_dir, process.hostname, process.rank},
                     process.thread_multiple ? world : nullptr);
  }
  TrainingLoop loop(config, process, job.groups(), job.engine(), *batches, progress, peak_flops, job.memory_bytes(),
                    job.locks());
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
