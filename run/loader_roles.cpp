#include "run/loader_roles.h"

#include <spdlog/spdlog.h>

#include <thread>

#include "data/dataset.h"
#include "data/sampler.h"
#include "parallel/process_groups.h"
#include "parallel/runtime.h"
#include "run/step_planner.h"

namespace hdp {
namespace {

// Plans every step from where training starts and sends each training rank its
// work; sending waits for the previous step's messages, so the scheduler runs at
// most about a step ahead of the training ranks' prefetch.
void schedule(const Config& config, const TokenDataset& dataset, MessageChannel& channel, int training_ranks,
              double timeout_s) {
  const Message message = channel.receive(0, kLoaderHelloTag, timeout_s, "training rank 0");
  const LoaderHello hello = decode_hello(message.payload);
  const StepPlanner planner(config, hello.cost);
  BatchSampler sampler(dataset, sampler_options(config.data), hello.sampler);
  for (int64_t step = hello.start_step + 1; step <= config.train.steps; ++step) {
    RankWork work;
    work.step = step;
    work.batch = sampler.next();
    const std::vector<int64_t> lengths = sequence_lengths(work.batch.sequences);
    const StepPlan plan = planner.plan(lengths);
    const StepPrediction prediction = planner.predict(plan, lengths);
    for (int rank = 0; rank < training_ranks; ++rank) {
      const int hdp_rank = config.parallel.coords(rank).hdp_rank;
      prediction.fill(hdp_rank, work.batch);
      work.micro_batches = rank_work(plan, lengths, hdp_rank);
      channel.send(rank, kLoaderWorkTag, encode_work(work));
    }
    channel.flush();
  }
}

}  // namespace

void run_loader_rank(const Config& config, const ProcessInfo& process, MessageChannel& channel, int training_ranks) {
  const TokenDataset dataset = TokenDataset::open(config.data.path, dataset_format(config.data));
  validate_dataset_vocab(config, dataset.vocab_size(), dataset.max_token_id());
  const int servers = static_cast<int>(config.loader.servers);
  spdlog::info("loader server {} of {} (world rank {}){}", process.rank - training_ranks, servers, process.rank,
               process.rank == training_ranks ? "; also the scheduler" : "");
  std::thread scheduler;
  if (process.rank == training_ranks) {
    scheduler = std::thread([&] {
      try {
        schedule(config, dataset, channel, training_ranks, config.loader.timeout_s * 10);
      } catch (const std::exception& e) {
        // The training ranks wait for this thread's plans: end the job now, with the reason.
        spdlog::error("loader scheduler (world rank {}): {}", process.rank, e.what());
        abort_job(1);
      }
    });
  }
  try {
    serve_tokens(dataset, channel, training_ranks, servers, training_ranks);
  } catch (...) {
    if (scheduler.joinable()) scheduler.detach();  // the job is going down
    throw;
  }
  if (scheduler.joinable()) scheduler.join();
}

}  // namespace hdp
