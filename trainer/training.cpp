#include "trainer/training.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "data/prefetcher.h"
#include "data/sampler.h"
#include "data/dataset.h"
#include "kernels/ops.h"
#include "trainer/checkpoint.h"
#include "trainer/metrics.h"
#include "trainer/model.h"
#include "trainer/optimizer.h"
#include "trainer/peak_flops.h"

namespace hdp {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

SamplerOptions sampler_options(const DataConfig& data) {
  SamplerOptions o;
  o.max_seq_len = data.max_seq_len;
  o.global_batch_tokens = data.global_batch_tokens;
  o.micro_batch_tokens = data.micro_batch_tokens;
  o.shuffle = data.shuffle;
  o.seed = data.seed;
  return o;
}

MicroBatchView view_of(const PackedMicroBatch& mb) {
  return MicroBatchView{mb.tokens, mb.targets, mb.positions, mb.cu_seqlens};
}

// Where training starts: a checkpoint to resume (weights, moments, step, data
// position), a checkpoint to take weights from, or fresh weights.
TrainingProgress restore_or_init(const Config& config, LlamaModel& model, AdamW& optimizer) {
  const TrainConfig& t = config.train;
  if (t.resume == "auto") {
    if (auto latest = latest_checkpoint(t.checkpoint_dir)) {
      TrainingProgress progress = load_checkpoint(*latest, model, &optimizer);
      spdlog::info("resumed from {} at step {}", *latest, progress.step);
      return progress;
    }
  }
  TrainingProgress progress;
  progress.train_seed = t.seed;
  progress.data_seed = config.data.seed;
  if (!t.init_from.empty()) {
    load_checkpoint(t.init_from, model, nullptr);
    spdlog::info("initial weights from {}", t.init_from);
  } else {
    model.init_weights(t.seed);
  }
  return progress;
}

}  // namespace

void run_training(const Config& config, const ProcessInfo& process) {
  const int threads = configure_threads(config.train.threads, process);
  TokenDataset dataset = TokenDataset::open(config.data.path);
  validate_dataset_vocab(config, dataset.vocab_size(), dataset.max_token_id());
  spdlog::info("dataset {}: {} documents, {} tokens", config.data.path, dataset.num_documents(),
               dataset.num_tokens());

  LlamaModel model(config.model, config.data.micro_batch_tokens);
  AdamW optimizer(config.optim, model.parameters(), model.flat_parameters().numel());
  const size_t memory_bytes =
      model.parameter_bytes() + model.gradient_bytes() + optimizer.state_bytes() + model.activation_bytes();
  spdlog::info("model: {:.2f} M parameters; memory {:.1f} MiB (parameters {:.1f}, gradients {:.1f}, optimizer {:.1f}, "
               "activations {:.1f}); {} threads",
               model.num_parameters() / 1e6, memory_bytes / 1048576.0, model.parameter_bytes() / 1048576.0,
               model.gradient_bytes() / 1048576.0, optimizer.state_bytes() / 1048576.0,
               model.activation_bytes() / 1048576.0, threads);

  TrainingProgress progress = restore_or_init(config, model, optimizer);
  if (progress.step >= config.train.steps) {
    spdlog::info("checkpoint step {} already reaches train.steps = {}; nothing to do", progress.step,
                 config.train.steps);
    return;
  }

  double peak_flops = config.train.peak_flops;
  if (peak_flops <= 0) {
    peak_flops = measure_gemm_flops();
    spdlog::info("peak: {:.1f} GFLOP/s fp32 GEMM measured (OpenBLAS {} kernels); set train.peak_flops to fix it",
                 peak_flops / 1e9, blas_core_name());
  }

  BatchPrefetcher prefetcher(BatchSampler(dataset, sampler_options(config.data), progress.sampler), 2);
  MetricsWriter metrics(config.train.run_dir, progress.step == 0);
  std::vector<int64_t> lengths;

  for (int64_t step = progress.step + 1; step <= config.train.steps; ++step) {
    const auto t0 = Clock::now();
    GlobalBatch batch = prefetcher.next();
    const double data_wait_ms = ms_since(t0);

    model.zero_grad();
    const float loss_scale = batch.predictions > 0 ? 1.0f / static_cast<float>(batch.predictions) : 0.0f;
    double loss_sum = 0;
    for (const PackedMicroBatch& mb : batch.micro_batches) loss_sum += model.forward_backward(view_of(mb), loss_scale);

    const double grad_norm = std::sqrt(sum_squares(model.flat_gradients()));
    const double lr = learning_rate(config.optim, step, config.train.steps);
    optimizer.step(model.flat_parameters(), model.flat_gradients(), lr, clip_factor(grad_norm, config.optim.grad_clip),
                   step);
    const double step_ms = ms_since(t0);

    lengths.clear();
    for (const SequenceSpan& s : batch.sequences) lengths.push_back(s.length);
    StepMetrics m;
    m.step = step;
    m.loss = batch.predictions > 0 ? loss_sum / static_cast<double>(batch.predictions) : 0.0;
    m.lr = lr;
    m.grad_norm = grad_norm;
    m.tokens = batch.predictions;
    m.input_tokens = batch.tokens;
    m.micro_batches = static_cast<int64_t>(batch.micro_batches.size());
    m.step_ms = step_ms;
    m.data_wait_ms = data_wait_ms;
    m.tokens_per_s = batch.tokens / (step_ms / 1e3);
    m.mfu = model.training_flops(lengths) / (step_ms / 1e3) / peak_flops;
    m.peak_mem_bytes = static_cast<int64_t>(memory_bytes);
    if (process.rank == 0) metrics.write(m);
    if (!std::isfinite(m.loss)) {
      throw std::runtime_error("loss is " + std::to_string(m.loss) + " at step " + std::to_string(step) +
                               "; stopping (lower optim.lr or check the data)");
    }
    if (step % config.train.log_every == 0 || step == 1 || step == config.train.steps) {
      spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | {:.0f} ms | mfu {:.1f}%",
                   step, config.train.steps, m.loss, lr, grad_norm, m.tokens_per_s, step_ms, 100 * m.mfu);
    }

    const bool checkpoint_due = config.train.checkpoint_every > 0 &&
                                (step % config.train.checkpoint_every == 0 || step == config.train.steps);
    if (checkpoint_due && process.rank == 0) {
      progress.step = step;
      progress.sampler = batch.next;
      const auto tc = Clock::now();
      spdlog::info("writing checkpoint for step {} ...", step);
      std::string path = save_checkpoint(config.train.checkpoint_dir, model, optimizer, progress, config.yaml,
                                         config.train.keep_checkpoints);
      spdlog::info("checkpoint {} written in {:.0f} ms", path, ms_since(tc));
    }
  }
  spdlog::info("training finished; metrics in {}", metrics.path());
}

}  // namespace hdp
