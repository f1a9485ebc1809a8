// A full training step (forward, backward, gradient reduction and norm, AdamW) of
// configs/bench-llama.yaml, next to the machine's fp32 GEMM rate measured in the
// same process, so the ratio is taken on one machine in one run.
//
//   build/bench/train_step_bench [--benchmark_repetitions=5]
//
// Counters: model_GFLOPs (per second, model FLOPs as in the MFU figure),
// tokens_per_s, and gemm_fraction = model FLOP/s / measured SGEMM FLOP/s.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "parallel/local_communicator.h"
#include "kernels/cpu/blas_threads.h"
#include "parallel/runtime.h"
#include "config/config.h"
#include "model/model.h"
#include "model/lr_schedule.h"
#include "kernels/peak_flops.h"

namespace hdp {
namespace {

double gemm_rate() {
  static const double rate = measure_gemm_flops(Device::CPU, 2048, 5);
  return rate;
}

Config bench_config() {
  return parse_config_text(
      R"(model: {vocab_size: 32000, hidden_size: 512, num_layers: 8, num_heads: 8, num_kv_heads: 4, ffn_hidden_size: 1376}
data: {path: unused.h5, max_seq_len: 1024, global_batch_tokens: 4096, micro_batch_tokens: 4096}
)",
      "bench-llama", {}, false);
}

struct SyntheticBatch {
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  std::vector<int64_t> lengths;
};

SyntheticBatch documents(int count, int length, int vocab) {
  SyntheticBatch b;
  uint64_t state = 12345;
  b.cu_seqlens.push_back(0);
  for (int d = 0; d < count; ++d) {
    for (int i = 0; i < length; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b.tokens.push_back(static_cast<int32_t>((state >> 33) % vocab));
      b.positions.push_back(i);
    }
    for (int i = 0; i < length; ++i) b.targets.push_back(i + 1 < length ? b.tokens[d * length + i + 1] : -1);
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    b.lengths.push_back(length);
  }
  return b;
}

void BM_GemmReference(benchmark::State& state) {
  for (auto _ : state) state.counters["GFLOPs"] = gemm_rate() / 1e9;
}
BENCHMARK(BM_GemmReference)->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);

// The model, optimizer and batch persist across the benchmark's repetitions and are
// warmed up by untimed steps first: the first steps touch the activation arenas,
// gradient buckets and optimizer state for the first time (page faults, a one-time
// cost of a run), so a timed step is the steady state a long run repeats.
struct BenchLlamaStep {
  static constexpr int kWarmupSteps = 2;
  Config config = bench_config();
  LlamaModel model{config.model, config.data.micro_batch_tokens};
  LocalCommunicator hdp{"hdp"}, world{"world"};
  ZeroAdamW optimizer{flat_parameters(model.parameter_table()), model.flat_parameters().numel(), config.optim, hdp,
                      world, config.parallel.bucket_mb << 18};
  SyntheticBatch batch = documents(4, 1024, static_cast<int>(config.model.vocab_size));
  MicroBatchView view{batch.tokens, batch.targets, batch.positions, batch.cu_seqlens};
  double flops = training_flops(config.model.shape(), batch.lengths);
  int64_t step = 0;

  BenchLlamaStep() {
    model.init_weights(1);
    for (int i = 0; i < kWarmupSteps; ++i) run();
  }

  double run() {
    model.zero_grad();
    optimizer.begin_reduction(model.flat_gradients());
    const double loss =
        model.forward_backward(view, 1.0f / 4092.0f, [&](int64_t offset) { optimizer.gradients_ready(offset); });
    double squares = 0;  // a sum on the host (kernels/ops.h): the model runs on the CPU
    optimizer.finish_gradients(DoubleTensor(&squares, {1}));
    const double norm = optimizer.gradient_norm(squares);
    optimizer.step(model.flat_parameters(), 1e-4, clip_factor(norm, 1.0), ++step);
    return loss;
  }
};

// One step per repetition; the aggregates (median of --benchmark_repetitions, 5 by
// default: main) are the figures to quote.
void BM_BenchLlamaTrainingStep(benchmark::State& state) {
  static BenchLlamaStep bench;
  const double rate = gemm_rate();
  for (auto _ : state) benchmark::DoNotOptimize(bench.run());
  state.counters["model_GFLOPs"] = benchmark::Counter(bench.flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens_per_s"] = benchmark::Counter(4096, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemm_GFLOPs"] = rate / 1e9;
  state.counters["gemm_fraction"] = benchmark::Counter(bench.flops / rate, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_GFLOP_per_step"] = bench.flops / 1e9;
}
BENCHMARK(BM_BenchLlamaTrainingStep)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

}  // namespace
}  // namespace hdp

int main(int argc, char** argv) {
  hdp::ProcessInfo single;
  const int threads = hdp::configure_threads(0, single);
  benchmark::AddCustomContext("openblas_core", hdp::cpu::blas_core_name());
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
  benchmark::AddCustomContext("threads", std::to_string(threads));
  // Five timed steps unless the command line says otherwise.
  std::vector<char*> args(argv, argv + argc);
  std::string repetitions = "--benchmark_repetitions=5";
  if (std::none_of(args.begin(), args.end(), [](const char* a) { return std::string(a).rfind("--benchmark_repetitions", 0) == 0; }))
    args.push_back(repetitions.data());
  argc = static_cast<int>(args.size());
  argv = args.data();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
