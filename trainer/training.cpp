#include "trainer/training.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/fault_injection.h"
#include "data/remote_loader.h"
#include "data/prefetcher.h"
#include "data/sampler.h"
#include "kernels/cpu/blas_threads.h"
#include "kernels/cuda/cuda_runtime.h"
#include "parallel/message_channel.h"
#include "parallel/process_groups.h"
#include "trainer/checkpoint.h"
#include "trainer/planner_cost.h"
#include "trainer/engine.h"
#include "trainer/loader_roles.h"
#include "trainer/metrics.h"
#include "model/optimizer.h"
#include "kernels/peak_flops.h"
#include "trainer/step_planner.h"

namespace hdp {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double mib(size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

GridShape grid_shape(const ParallelConfig& p) {
  return GridShape{static_cast<int>(p.tp), static_cast<int>(p.pp), static_cast<int>(p.hdp)};
}

// Where training starts: a checkpoint to resume (weights, moments, step, data
// position), a checkpoint to take weights from, or fresh weights.
TrainingProgress restore_or_init(const Config& config, TrainingEngine& engine) {
  const TrainConfig& t = config.train;
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

}  // namespace

void run_training(const Config& config, const ProcessInfo& process) {
  const GridShape shape = grid_shape(config.parallel);
  const bool remote = config.loader.mode == LoaderMode::Remote;
  const int loader_ranks = remote ? static_cast<int>(config.loader.servers) : 0;
  const int training_ranks = shape.world();
  if (training_ranks + loader_ranks != process.world_size) {
    throw ConfigError("parallel.tp x parallel.pp x parallel.hdp = " + std::to_string(shape.tp) + " x " +
                      std::to_string(shape.pp) + " x " + std::to_string(shape.hdp) + " = " +
                      std::to_string(training_ranks) + " ranks" +
                      (remote ? " plus loader.servers = " + std::to_string(loader_ranks) : std::string()) +
                      ", but the job has " + std::to_string(process.world_size) + "; launch with mpirun -np " +
                      std::to_string(training_ranks + loader_ranks) + " or change the degrees");
  }
  const int threads = configure_threads(config.train.threads, process);
  const Device device = config.train.device;
  const bool on_gpu = device == Device::CUDA;
  if (on_gpu) {
    // The GPU of the local rank modulo those visible (CUDA_VISIBLE_DEVICES): one per
    // rank when there are enough, else several ranks of a node share one.
    std::string why;
    if (!cuda::available(&why)) {
      throw ConfigError("train.device: cuda asked for, but rank " + std::to_string(process.rank) + " on " +
                        process.hostname + " has no usable CUDA device (" + why + ")");
    }
    const int visible = cuda::device_count();
    const int gpu = process.local_rank % visible;
    cuda::initialize(gpu);
    cuda::set_tf32(config.train.tf32);
    spdlog::info("rank {} (local rank {}): GPU {} of {} visible{}, {}{}", process.rank, process.local_rank, gpu,
                 visible, process.local_size > visible ? " (shared by the node's ranks)" : "",
                 cuda::device_description(), config.train.tf32 ? ", fp32 GEMMs on TF32 tensor cores" : "");
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
  std::optional<TokenDataset> dataset;
  if (!remote) {
    dataset.emplace(TokenDataset::open(config.data.path));
    validate_dataset_vocab(config, dataset->vocab_size(), dataset->max_token_id());
  }

  ProcessGroups groups(shape, config.model.tie_embeddings, std::move(training_world));
  const GridCoords& coords = groups.coords();
  spdlog::info("rank {} on {}: tp {} pp {} hdp {}; {} threads", process.rank, process.hostname, coords.tp_rank,
               coords.pp_rank, coords.hdp_rank, threads);
  if (process.rank == 0) {
    if (dataset) {
      spdlog::info("dataset {}: {} documents, {} tokens", config.data.path, dataset->num_documents(),
                   dataset->num_tokens());
    } else {
      spdlog::info("data from {} loader rank(s) (world ranks {}..{}), scheduler on world rank {}", loader_ranks,
                   training_ranks, training_ranks + loader_ranks - 1, training_ranks);
    }
    spdlog::info("{}", describe_grid(shape));
    spdlog::info("OpenBLAS {} kernels", cpu::blas_core_name());
  }

  TrainingEngine engine(config, groups);
  const MemoryReport memory = engine.memory();
  if (coords.tp_rank == 0 && coords.hdp_rank == 0) {
    std::string layers;
    for (int64_t n : engine.stage_layers()) layers += (layers.empty() ? "" : " + ") + std::to_string(n);
    spdlog::info("stage {} (layers {}): {:.2f} M parameters on this rank; device memory {:.1f} MiB (parameters {:.1f}, "
                 "gradients {:.1f}, optimizer shard {:.1f}, activations {:.1f}, pipeline buffers {:.1f}, ring buffers "
                 "{:.1f}); host pool for offloaded activations {:.1f} MiB",
                 coords.pp_rank, layers, engine.model().num_parameters() / 1e6, mib(memory.total()),
                 mib(memory.parameters), mib(memory.gradients), mib(memory.optimizer), mib(memory.activations),
                 mib(memory.pipeline), mib(memory.ring), mib(memory.host_pool));
  }

  TrainingProgress progress = restore_or_init(config, engine);
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

  double peak_flops = config.train.peak_flops;
  if (peak_flops <= 0 && on_gpu) {
    peak_flops = gpu_bf16_peak_flops(cuda::device_description());
    if (process.rank == 0 && peak_flops > 0) {
      spdlog::info("peak: {:.0f} TFLOP/s dense BF16 (datasheet) per GPU for MFU", peak_flops / 1e12);
    }
  }
  if (peak_flops <= 0) {
    peak_flops = measure_gemm_flops(device);
    // Ranks sharing a node measured together; the figure of each is its share.
    if (!on_gpu) peak_flops = groups.world().all_reduce_sum(peak_flops) / training_ranks;
    if (process.rank == 0 && on_gpu) {
      spdlog::info("peak: {:.1f} TFLOP/s fp32 GEMM measured on this GPU (unknown model); set train.peak_flops to fix it",
                   peak_flops / 1e12);
    } else if (process.rank == 0) {
      spdlog::info("peak: {:.1f} GFLOP/s fp32 GEMM per rank measured (OpenBLAS {} kernels); set train.peak_flops to fix it",
                   peak_flops / 1e9, cpu::blas_core_name());
    }
  }

  // Local: every rank samples the same sequences and makes the same plan, then
  // reads only its own micro-batches. Remote: the loader's scheduler plans and the
  // servers send this rank's tokens. Either way in the prefetch thread.
  // Every rank plans with the same cost model (profiling, if asked for, is a
  // collective that averages the ranks' measurements).
  const CostModel cost =
      planner_cost_model(config, peak_flops, engine.model().saved_floats_per_token(), &groups.world());
  std::optional<StepPlanner> planner;
  std::optional<BatchSampler> sampler;
  std::function<GlobalBatch()> produce;
  if (loader) {
    if (process.rank == 0) {
      channel->send(training_ranks, kLoaderHelloTag, encode_hello({progress.step, progress.sampler, cost}));
    }
    // The prefetcher runs ahead of the loop: past the last step there is no work to
    // wait for.
    produce = [&, remaining = config.train.steps - progress.step]() mutable {
      return remaining-- > 0 ? loader->next() : GlobalBatch{};
    };
  } else {
    planner.emplace(config, cost);
    sampler.emplace(*dataset, sampler_options(config.data), progress.sampler);
    produce = [&] { return planner->next_local_batch(*sampler, *dataset, coords.hdp_rank); };
  }
  BatchPrefetcher prefetcher(produce, 2);
  const CheckpointLayout layout{shape.tp, shape.pp, shape.hdp, coords.tp_rank, coords.pp_rank, coords.hdp_rank,
                                process.rank, &groups.world()};
  std::optional<MetricsWriter> metrics;
  if (process.rank == 0) metrics.emplace(config.train.run_dir, progress.step == 0);
  std::vector<int64_t> lengths;
  const FaultInjection fault = fault_injection_from_env();

  for (int64_t step = progress.step + 1; step <= config.train.steps; ++step) {
    if (fault.rank == process.rank && fault.step == step) {
      spdlog::critical("fault injection: rank {} exits abruptly at step {}", process.rank, step);
      std::_Exit(3);
    }
    const auto t0 = Clock::now();
    GlobalBatch batch = prefetcher.next();
    const double data_wait_ms = ms_since(t0);
    const double lr = learning_rate(config.optim, step, config.train.steps);
    groups.tp().reset_stats();
    groups.pp().reset_stats();
    groups.hdp().reset_stats();
    const int64_t offloaded_before = engine.model().activation_usage().offloaded_bytes;
    const StepResult result = engine.step(batch.micro_batches, lr, step);
    const double step_ms = ms_since(t0);

    lengths.clear();
    for (const SequenceSpan& s : batch.sequences) lengths.push_back(s.length);
    StepMetrics m;
    m.step = step;
    m.loss = result.loss;
    m.lr = lr;
    m.grad_norm = result.grad_norm;
    m.tokens = result.predictions;
    m.input_tokens = batch.tokens;
    m.micro_batches = static_cast<int64_t>(batch.micro_batches.size());
    for (const PackedMicroBatch& mb : batch.micro_batches) m.rank_tokens += mb.num_tokens();
    m.step_ms = step_ms;
    m.data_wait_ms = data_wait_ms;
    m.tokens_per_s = batch.tokens / (step_ms / 1e3);
    m.mfu = training_flops(config.model, lengths) / (step_ms / 1e3) / (peak_flops * training_ranks);
    m.peak_mem_bytes = static_cast<int64_t>(memory.total());
    auto sent = [](const Communicator& c) { return c.stats().p2p_bytes + c.stats().collective_bytes; };
    m.tp_bytes = sent(groups.tp());
    m.pp_bytes = sent(groups.pp());
    m.hdp_bytes = sent(groups.hdp());
    // Job-wide figures: ring traffic, offloaded bytes, and every rank's measured
    // and planned busy time.
    std::vector<double> totals = {static_cast<double>(groups.hdp().stats().p2p_bytes),
                                  static_cast<double>(engine.model().activation_usage().offloaded_bytes - offloaded_before)};
    groups.world().all_reduce(std::span<double>(totals), ReduceOp::Sum);
    m.busy_ms.assign(training_ranks, 0.0);
    m.planned_busy_ms.assign(training_ranks, 0.0);
    m.busy_ms[groups.world().rank()] = result.busy_ms;
    m.planned_busy_ms[groups.world().rank()] = batch.planned_busy_s * 1e3;
    groups.world().all_reduce(std::span<double>(m.busy_ms), ReduceOp::Sum);
    groups.world().all_reduce(std::span<double>(m.planned_busy_ms), ReduceOp::Sum);
    m.attention_bytes = static_cast<int64_t>(totals[0]);
    m.offloaded_bytes = static_cast<int64_t>(totals[1]);
    m.busy_ms_max = *std::max_element(m.busy_ms.begin(), m.busy_ms.end());
    m.busy_ms_min = *std::min_element(m.busy_ms.begin(), m.busy_ms.end());
    const double busy_sum = std::accumulate(m.busy_ms.begin(), m.busy_ms.end(), 0.0);
    m.idle_fraction = std::max(0.0, 1.0 - busy_sum / training_ranks / step_ms);
    m.planned_busy_ms_max = batch.planned_max_busy_s * 1e3;
    m.cost_model_error = m.planned_busy_ms_max > 0 ? (m.busy_ms_max - m.planned_busy_ms_max) / m.planned_busy_ms_max : 0;
    m.activation_peak_bytes = static_cast<int64_t>(engine.model().activation_usage().device_peak_bytes);
    m.host_pool_bytes = static_cast<int64_t>(engine.model().activation_usage().host_pool_bytes);
    if (metrics) metrics->write(m);
    if (!std::isfinite(m.loss)) {
      throw std::runtime_error("loss is " + std::to_string(m.loss) + " at step " + std::to_string(step) +
                               "; stopping (lower optim.lr or check the data)");
    }
    if (process.rank == 0 && (step % config.train.log_every == 0 || step == 1 || step == config.train.steps)) {
      spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | {:.0f} ms | mfu {:.1f}% | "
                   "busy {:.0f}-{:.0f} ms (planned max {:.0f}, cost model {:+.0f}%) idle {:.0f}%",
                   step, config.train.steps, m.loss, lr, m.grad_norm, m.tokens_per_s, step_ms, 100 * m.mfu,
                   m.busy_ms_min, m.busy_ms_max, m.planned_busy_ms_max, 100 * m.cost_model_error,
                   100 * m.idle_fraction);
    }

    const bool checkpoint_due = config.train.checkpoint_every > 0 &&
                                (step % config.train.checkpoint_every == 0 || step == config.train.steps);
    if (checkpoint_due) {
      progress.step = step;
      progress.sampler = batch.next;
      const auto tc = Clock::now();
      if (process.rank == 0) spdlog::info("writing checkpoint for step {} ...", step);
      const std::string path = save_checkpoint(config.train.checkpoint_dir, engine.model(), engine.optimizer(),
                                               progress, config.yaml, config.train.keep_checkpoints, layout);
      if (process.rank == 0) spdlog::info("checkpoint {} written in {:.0f} ms", path, ms_since(tc));
    }
  }
  if (loader) loader->stop_servers();
  if (on_gpu && cuda::op_times_enabled()) spdlog::info("rank {}: {}", process.rank, cuda::op_times_report());
  if (process.rank == 0) spdlog::info("training finished; metrics in {}", metrics->path());
}

}  // namespace hdp
