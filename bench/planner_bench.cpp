// Google Benchmark for the step planners at ByteScale's scale: a 32M-token global
// batch of long-tailed sequences up to 2M tokens over 1,024 and 12,288 hdp ranks.
//
//   build/bench/planner_bench --benchmark_counters_tabular=true
//
// check_plan runs once per configuration (its pairwise ring-order check grows with
// the square of ring sizes: widened rings make it the slowest part).
//
// The batch (fixed seed): one sequence of 2M tokens, then 0.4% of sequences
// log-uniform in [128K, 2M] tokens, the rest lognormal with median 1.5K tokens
// (sigma 1.2) clipped to [16, 128K], drawn until 32M tokens (the last one shortened
// to hit 32M exactly). That gives about
// 80% of sequences at most 4K tokens and roughly 45% of the tokens in sequences of
// 128K or more ("Byted" in ByteScale, Ge et al., 2025, its section on data
// heterogeneity).
//
// Settings: capacity C = 16K tokens, 8 layers per stage, one pipeline stage,
// analytic cost model of a LLaMA-7B layer (hidden 4096, 32 heads, 8 KV heads,
// FFN 11008) at 300 TFLOP/s, 25 GB/s copies each way, the LM head (vocabulary
// 32000) as per-token head cost.
//
// Counters: sequences, rings, micro-batches, and max/ideal = the busiest rank's
// predicted seconds over the mean (predicted_rank_seconds; 1 is perfect).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "spec/model_shape.h"
#include "planning/cost_model.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"

namespace {

using namespace hdp;

constexpr int64_t kGlobalTokens = int64_t{32} << 20;
constexpr int64_t kLongest = int64_t{2} << 20;
constexpr int64_t kCapacity = 16384;

std::vector<int64_t> long_tailed_batch(int64_t total_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> body(std::log(1536.0), 1.2);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double lo = std::log(131072.0), hi = std::log(static_cast<double>(kLongest));
  std::vector<int64_t> lengths = {kLongest};  // one sequence at the longest, whatever the draws
  int64_t total = kLongest;
  while (total < total_tokens) {
    int64_t len;
    if (unit(rng) < 0.004) {
      len = static_cast<int64_t>(std::exp(lo + (hi - lo) * unit(rng)));
    } else {
      len = std::clamp<int64_t>(static_cast<int64_t>(body(rng)), 16, 131072);
    }
    len = std::min(len, total_tokens - total);
    lengths.push_back(len);
    total += len;
  }
  return lengths;
}

const std::vector<int64_t>& batch() {
  static const std::vector<int64_t> b = long_tailed_batch(kGlobalTokens, 20250301);
  return b;
}

PlannerSettings settings(int hdp) {
  PlannerSettings s;
  s.hdp = hdp;
  s.capacity = kCapacity;
  s.layers_per_stage = 8;
  s.pipeline_stages = 1;
  const double rate = 300e12;
  // LLaMA-7B's layer, 24 x hidden saved floats per token.
  const ModelShape llama7b{.name = "llama-7b", .hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128, .ffn = 11008, .vocab = 32000};
  s.cost = analytic_cost_model(llama7b, 1, 4.0 * 24 * 4096, rate, 25e9);
  s.cost.embedding_seconds_per_token = 2.0 * 4096 / rate;
  s.cost.head_seconds_per_token = head_flops_per_token(llama7b, 1) / rate;
  return s;
}

void count(benchmark::State& state, const StepPlan& p, const std::vector<int64_t>& lengths, const PlannerSettings& s) {
  size_t micro_batches = 0;
  for (const auto& rank : p.ranks) micro_batches += rank.size();
  const std::vector<double> t = predicted_rank_seconds(p, lengths, s);
  const double most = *std::max_element(t.begin(), t.end());
  const double ideal = std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(t.size());
  state.counters["sequences"] = static_cast<double>(lengths.size());
  state.counters["rings"] = static_cast<double>(p.rings.size());
  state.counters["micro_batches"] = static_cast<double>(micro_batches);
  state.counters["max/ideal"] = most / ideal;
}

// Arguments: hdp ranks, mode (0 DataParallel, 1 Pipeline), widen_min_fill in
// percent (-1: no widening), pipeline stages.
PlannerSettings settings_of(const benchmark::State& state) {
  PlannerSettings s = settings(static_cast<int>(state.range(0)));
  s.pipeline_stages = static_cast<int>(state.range(3));
  return s;
}
BalanceSettings balance_of(const benchmark::State& state) {
  BalanceSettings b;
  b.mode = state.range(1) == 0 ? BalanceMode::DataParallel : BalanceMode::Pipeline;
  b.widen = state.range(2) >= 0;
  b.widen_min_fill = state.range(2) >= 0 ? static_cast<double>(state.range(2)) / 100 : 0.0;
  return b;
}

void BM_PlanNaive(benchmark::State& state) {
  const PlannerSettings s = settings_of(state);
  const std::vector<int64_t>& lengths = batch();
  StepPlan p;
  for (auto _ : state) {
    p = plan_naive(lengths, s);
    benchmark::DoNotOptimize(p.ranks.data());
  }
  count(state, p, lengths, s);
}

void BM_PlanBalance(benchmark::State& state) {
  const PlannerSettings s = settings_of(state);
  const BalanceSettings b = balance_of(state);
  const std::vector<int64_t>& lengths = batch();
  StepPlan p;
  for (auto _ : state) {
    p = plan_balance(lengths, s, b);
    benchmark::DoNotOptimize(p.ranks.data());
  }
  count(state, p, lengths, s);
}

void BM_PredictedRankSeconds(benchmark::State& state) {
  const PlannerSettings s = settings_of(state);
  const std::vector<int64_t>& lengths = batch();
  const StepPlan p = plan_balance(lengths, s, balance_of(state));
  for (auto _ : state) {
    std::vector<double> t = predicted_rank_seconds(p, lengths, s);
    benchmark::DoNotOptimize(t.data());
  }
}

// check_plan on plan_balance's plan (mode -2: on plan_naive's).
void BM_CheckPlan(benchmark::State& state) {
  const PlannerSettings s = settings_of(state);
  const std::vector<int64_t>& lengths = batch();
  const StepPlan p = state.range(1) == -2 ? plan_naive(lengths, s) : plan_balance(lengths, s, balance_of(state));
  for (auto _ : state) check_plan(p, lengths, s.layers_per_stage, s.pipeline_stages);
  count(state, p, lengths, s);
}

// The batch itself: how long-tailed it is.
void BM_GenerateBatch(benchmark::State& state) {
  std::vector<int64_t> lengths;
  for (auto _ : state) {
    lengths = long_tailed_batch(kGlobalTokens, 20250301);
    benchmark::DoNotOptimize(lengths.data());
  }
  const double n = static_cast<double>(lengths.size());
  double short_count = 0, long_tokens = 0, total = 0;
  for (int64_t len : lengths) {
    short_count += len <= 4096;
    if (len >= 131072) long_tokens += static_cast<double>(len);
    total += static_cast<double>(len);
  }
  state.counters["sequences"] = n;
  state.counters["share<=4K"] = short_count / n;
  state.counters["tokens>=128K"] = long_tokens / total;
  state.counters["longest"] = static_cast<double>(*std::max_element(lengths.begin(), lengths.end()));
}

void balance_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"hdp", "mode", "fill%", "pp"});
  for (int64_t hdp : {1024, 12288}) {
    b->Args({hdp, 0, 25, 1});   // defaults, DataParallel
    b->Args({hdp, 1, 25, 1});   // Pipeline mode
    b->Args({hdp, 0, -1, 1});   // rings as choose_ranks says
    b->Args({hdp, 0, 0, 1});    // widening without a floor on member tokens
    b->Args({hdp, 1, 25, 4});   // four pipeline stages of 8 layers
  }
}
void naive_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"hdp", "mode", "fill%", "pp"});
  for (int64_t hdp : {1024, 12288}) {
    b->Args({hdp, -2, 0, 1});
    b->Args({hdp, -2, 0, 4});
  }
}

BENCHMARK(BM_GenerateBatch)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanNaive)->Apply(naive_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanBalance)->Apply(balance_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PredictedRankSeconds)->Apply(balance_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CheckPlan)->Apply(naive_args)->Apply(balance_args)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
