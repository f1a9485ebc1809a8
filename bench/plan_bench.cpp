// Planning and simulating one global batch at cluster scale, as `trainer plan`
// does: LLaMA-7B on the H100 cluster of configs/cluster/h100.yaml, one 32M-token
// batch (33,554,432 tokens) of the "byted" distribution at 256K and 2M context, on
// 1,024 and 12,288 GPUs, at tp 8 (hdp 128 and 1,536) and tp 1 (README's example:
// hdp 1,024 and 12,288, rings of hundreds of ranks).
//
//   build/bench/plan_bench [--benchmark_filter=Plan]
//
// Arguments <policy>/<gpus>/<context>/<tp>: policy 0 static, 1 naive, 2 balance;
// context 262144 (256K) or 2097152 (2M); tp 8 or 1.
// BM_Plan: the planner alone.
// BM_CheckPlan: check_plan of that plan.
// BM_Simulate: building and replaying the step's op graph.
// BM_Bound: the step's lower bound (planning/step_bound.h).
// BM_SearchSetups: one policy's search of `--recompute auto`'s setups (five at tp 1,
// eight at tp 8: search_setups, trainer/plan_command.h), pruned by the bound and
// sharing equal plans; counters simulated, shared, pruned.
// BM_SimulateMany/<gpus>: a graph with many micro-batches (tp 1, pp 4,
// capacity 4,096 tokens, 2M) to show the replay's cost per operation.
// Counters: ops (graph operations), step_s (simulated step).

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "data/length_distributions.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"
#include "planning/step_bound.h"
#include "whatif/step_simulation.h"
#include "trainer/plan_command.h"

namespace hdp {
namespace {

constexpr int64_t kBatch = 32 * 1024 * 1024;
const char* const kPolicies[] = {"static", "naive", "balance"};
const std::vector<int64_t> kGpus = {1024, 12288};
const std::vector<int64_t> kContexts = {256 * 1024, 2 * 1024 * 1024};
const std::vector<int64_t> kTps = {8, 1};

struct Case {
  PlanSetup setup;
  std::vector<int64_t> lengths;
};

const Case& get_case(int gpus, int64_t context, int tp = 8, int pp = 1, int64_t capacity = 0) {
  static std::map<std::tuple<int, int64_t, int, int, int64_t>, Case> cases;
  auto key = std::make_tuple(gpus, context, tp, pp, capacity);
  auto it = cases.find(key);
  if (it == cases.end()) {
    const std::string dir = std::string(HDP_SOURCE_DIR) + "/configs/";
    Case c;
    c.setup = make_plan_setup(load_cluster_file(dir + "cluster/h100.yaml"), load_model_file(dir + "models/llama-7b.yaml"),
                              gpus, tp, pp, context, capacity);
    c.lengths = sample_global_batch(builtin_distribution("byted"), context, kBatch, 1);
    it = cases.emplace(key, std::move(c)).first;
  }
  return it->second;
}

const StepPlan& get_plan(int policy, int gpus, int64_t context, int tp) {
  static std::map<std::tuple<int, int, int64_t, int>, StepPlan> plans;
  auto key = std::make_tuple(policy, gpus, context, tp);
  auto it = plans.find(key);
  if (it == plans.end()) {
    const Case& c = get_case(gpus, context, tp);
    it = plans.emplace(key, plan_policy(kPolicies[policy])(c.lengths, c.setup)).first;
  }
  return it->second;
}

// The policy, GPU count, context and tp of a benchmark's arguments, with its label.
struct Args {
  int policy, gpus;
  int64_t context;
  int tp;
};
Args args(benchmark::State& state) {
  const Args a{static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), state.range(2),
               static_cast<int>(state.range(3))};
  state.SetLabel(std::string(kPolicies[a.policy]) + " " + std::to_string(a.gpus) + " GPUs " +
                 std::to_string(a.context / 1024) + "K tp " + std::to_string(a.tp));
  return a;
}

void BM_SampleBatch(benchmark::State& state) {
  for (auto _ : state) {
    auto v = sample_global_batch(builtin_distribution("byted"), state.range(0), kBatch, 1);
    benchmark::DoNotOptimize(v.data());
  }
}
BENCHMARK(BM_SampleBatch)->ArgsProduct({kContexts})->Unit(benchmark::kMillisecond);

void BM_Plan(benchmark::State& state) {
  const Args a = args(state);
  const Case& c = get_case(a.gpus, a.context, a.tp);
  for (auto _ : state) {
    StepPlan plan = plan_policy(kPolicies[a.policy])(c.lengths, c.setup);
    benchmark::DoNotOptimize(plan.ranks.data());
  }
}
BENCHMARK(BM_Plan)->ArgsProduct({{0, 1, 2}, kGpus, kContexts, kTps})->Unit(benchmark::kMillisecond);

void BM_CheckPlan(benchmark::State& state) {
  const Args a = args(state);
  const Case& c = get_case(a.gpus, a.context, a.tp);
  const StepPlan& plan = get_plan(a.policy, a.gpus, a.context, a.tp);
  for (auto _ : state)
    check_plan(plan, c.lengths, c.setup.settings.layers_per_stage, c.setup.settings.pipeline_stages);
}
BENCHMARK(BM_CheckPlan)->ArgsProduct({{0, 1, 2}, kGpus, kContexts, kTps})->Unit(benchmark::kMillisecond);

void BM_Simulate(benchmark::State& state) {
  const Args a = args(state);
  const Case& c = get_case(a.gpus, a.context, a.tp);
  const StepPlan& plan = get_plan(a.policy, a.gpus, a.context, a.tp);
  StepSimulation s;
  for (auto _ : state) s = simulate_step(plan, c.lengths, c.setup.costs);
  state.counters["ops"] = static_cast<double>(s.operations);
  state.counters["step_s"] = s.step_seconds;
}
BENCHMARK(BM_Simulate)->ArgsProduct({{0, 1, 2}, kGpus, kContexts, kTps})->Unit(benchmark::kMillisecond);

void BM_Bound(benchmark::State& state) {
  const int gpus = static_cast<int>(state.range(0));
  const Case& c = get_case(gpus, state.range(1));
  StepBound b;
  for (auto _ : state) b = simulated_step_bound(c.setup, c.lengths);
  state.counters["bound_s"] = b.seconds();
}
BENCHMARK(BM_Bound)->ArgsProduct({kGpus, kContexts})->Unit(benchmark::kMillisecond);

// --recompute auto's setups of a case: none, none+selective, none+full, selective,
// full, and at tp above 1 none, selective and full with sequence parallelism (those
// memory cannot hold left out).
const std::vector<PlanSetup>& get_auto_setups(int gpus, int64_t context, int tp) {
  static std::map<std::tuple<int, int64_t, int>, std::vector<PlanSetup>> setups;
  auto key = std::make_tuple(gpus, context, tp);
  auto it = setups.find(key);
  if (it == setups.end()) {
    const PlanSetup& base = get_case(gpus, context, tp).setup;
    constexpr RecomputeMode none = RecomputeMode::None, selective = RecomputeMode::Selective,
                            full = RecomputeMode::Full;
    const std::tuple<RecomputeMode, RecomputeMode, bool> modes[] = {
        {none, none, false},      {none, selective, false}, {none, full, false}, {selective, none, false},
        {full, none, false},      {none, none, true},       {selective, none, true}, {full, none, true}};
    std::vector<PlanSetup> list;
    for (const auto& [mode, mixed, sp] : modes) {
      if (sp && tp == 1) continue;
      try {
        list.push_back(make_plan_setup(base.hardware, base.model, gpus, tp, 1, context, 0, 1, 1, mode, sp, mixed));
      } catch (const PlanInputError&) {
      }
    }
    it = setups.emplace(key, std::move(list)).first;
  }
  return it->second;
}

void BM_SearchSetups(benchmark::State& state) {
  const Args a = args(state);
  const std::vector<PlanSetup>& setups = get_auto_setups(a.gpus, a.context, a.tp);
  const std::vector<int64_t>& lengths = get_case(a.gpus, a.context, a.tp).lengths;
  SetupSearch search;
  for (auto _ : state) search = search_setups(kPolicies[a.policy], setups, lengths);
  state.counters["simulated"] = search.simulated;
  state.counters["shared"] = search.shared;
  state.counters["pruned"] = search.pruned;
  state.counters["step_s"] = search.step_seconds;
}
BENCHMARK(BM_SearchSetups)->ArgsProduct({{0, 1, 2}, kGpus, kContexts, kTps})->Unit(benchmark::kMillisecond);

// Many small micro-batches through a 4-stage pipeline: the graph grows with the
// number of micro-batches; time per operation stays flat.
void BM_SimulateMany(benchmark::State& state) {
  const int gpus = static_cast<int>(state.range(0));
  const Case& c = get_case(gpus, kContexts.back(), 1, 4, 4096);
  const StepPlan plan = plan_naive(c.lengths, c.setup.settings);
  StepSimulation s;
  for (auto _ : state) s = simulate_step(plan, c.lengths, c.setup.costs);
  state.counters["ops"] = static_cast<double>(s.operations);
  state.counters["ns_per_op"] = benchmark::Counter(static_cast<double>(s.operations) * state.iterations() * 1e-9,
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["step_s"] = s.step_seconds;
}
BENCHMARK(BM_SimulateMany)->ArgsProduct({kGpus})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hdp

BENCHMARK_MAIN();
