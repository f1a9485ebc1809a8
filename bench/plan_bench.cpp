// Planning and simulating one global batch at cluster scale, as `trainer plan`
// does: LLaMA-7B on the H100 cluster of configs/cluster/h100.yaml, tp 8, one
// 32M-token batch (33,554,432 tokens) of the "byted" distribution at 2M context,
// on 1,024 and 12,288 GPUs (hdp 128 and 1,536).
//
//   build/bench/plan_bench [--benchmark_filter=Plan]
//
// BM_Plan/<policy>/<gpus>: the planner alone (static, naive, balance).
// BM_CheckPlan/<policy>/<gpus>: check_plan of that plan.
// BM_Simulate/<policy>/<gpus>: building and replaying the step's op graph.
// BM_SimulateMany/<gpus>: a graph with many micro-batches (tp 1, pp 4,
// capacity 4,096 tokens) to show the replay's cost per operation.
// Counters: ops (graph operations), step_s (simulated step), ranks.

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "data/length_distributions.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"
#include "whatif/step_simulation.h"
#include "trainer/plan_command.h"

namespace hdp {
namespace {

constexpr int64_t kContext = 2 * 1024 * 1024;
constexpr int64_t kBatch = 32 * 1024 * 1024;
const char* const kPolicies[] = {"static", "naive", "balance"};

struct Case {
  PlanSetup setup;
  std::vector<int64_t> lengths;
};

const Case& get_case(int gpus, int tp = 8, int pp = 1, int64_t capacity = 0) {
  static std::map<std::tuple<int, int, int, int64_t>, Case> cases;
  auto key = std::make_tuple(gpus, tp, pp, capacity);
  auto it = cases.find(key);
  if (it == cases.end()) {
    const std::string dir = std::string(HDP_SOURCE_DIR) + "/configs/";
    Case c;
    c.setup = make_plan_setup(load_cluster_file(dir + "cluster/h100.yaml"), load_model_file(dir + "models/llama-7b.yaml"),
                              gpus, tp, pp, kContext, capacity);
    c.lengths = sample_global_batch(builtin_distribution("byted"), kContext, kBatch, 1);
    it = cases.emplace(key, std::move(c)).first;
  }
  return it->second;
}

const StepPlan& get_plan(int policy, int gpus) {
  static std::map<std::pair<int, int>, StepPlan> plans;
  auto it = plans.find({policy, gpus});
  if (it == plans.end()) {
    const Case& c = get_case(gpus);
    it = plans.emplace(std::make_pair(policy, gpus), plan_policy(kPolicies[policy])(c.lengths, c.setup)).first;
  }
  return it->second;
}

void BM_SampleBatch(benchmark::State& state) {
  for (auto _ : state) {
    auto v = sample_global_batch(builtin_distribution("byted"), kContext, kBatch, 1);
    benchmark::DoNotOptimize(v.data());
  }
}
BENCHMARK(BM_SampleBatch)->Unit(benchmark::kMillisecond);

void BM_Plan(benchmark::State& state) {
  const int policy = static_cast<int>(state.range(0)), gpus = static_cast<int>(state.range(1));
  const Case& c = get_case(gpus);
  state.SetLabel(std::string(kPolicies[policy]) + " hdp " + std::to_string(c.setup.layout.hdp));
  for (auto _ : state) {
    StepPlan plan = plan_policy(kPolicies[policy])(c.lengths, c.setup);
    benchmark::DoNotOptimize(plan.ranks.data());
  }
}
BENCHMARK(BM_Plan)->ArgsProduct({{0, 1, 2}, {1024, 12288}})->Unit(benchmark::kMillisecond);

void BM_CheckPlan(benchmark::State& state) {
  const int policy = static_cast<int>(state.range(0)), gpus = static_cast<int>(state.range(1));
  const Case& c = get_case(gpus);
  const StepPlan& plan = get_plan(policy, gpus);
  state.SetLabel(kPolicies[policy]);
  for (auto _ : state)
    check_plan(plan, c.lengths, c.setup.settings.layers_per_stage, c.setup.settings.pipeline_stages);
}
BENCHMARK(BM_CheckPlan)->ArgsProduct({{0, 1, 2}, {1024, 12288}})->Unit(benchmark::kMillisecond);

void BM_Simulate(benchmark::State& state) {
  const int policy = static_cast<int>(state.range(0)), gpus = static_cast<int>(state.range(1));
  const Case& c = get_case(gpus);
  const StepPlan& plan = get_plan(policy, gpus);
  state.SetLabel(kPolicies[policy]);
  StepSimulation s;
  for (auto _ : state) s = simulate_step(plan, c.lengths, c.setup.costs);
  state.counters["ops"] = static_cast<double>(s.operations);
  state.counters["step_s"] = s.step_seconds;
}
BENCHMARK(BM_Simulate)->ArgsProduct({{0, 1, 2}, {1024, 12288}})->Unit(benchmark::kMillisecond);

// Many small micro-batches through a 4-stage pipeline: the graph grows with the
// number of micro-batches; time per operation stays flat.
void BM_SimulateMany(benchmark::State& state) {
  const int gpus = static_cast<int>(state.range(0));
  const Case& c = get_case(gpus, 1, 4, 4096);
  const StepPlan plan = plan_naive(c.lengths, c.setup.settings);
  StepSimulation s;
  for (auto _ : state) s = simulate_step(plan, c.lengths, c.setup.costs);
  state.counters["ops"] = static_cast<double>(s.operations);
  state.counters["ns_per_op"] = benchmark::Counter(static_cast<double>(s.operations) * state.iterations() * 1e-9,
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["step_s"] = s.step_seconds;
}
BENCHMARK(BM_SimulateMany)->Arg(1024)->Arg(12288)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hdp

BENCHMARK_MAIN();
