// A program of the planning and what-if layers alone (ctest plan_only): it plans
// one long-tailed global batch for 8 hdp ranks of LLaMA-7B-sized layers with the
// balance policy, checks the plan, gives every rank its share (rank_work) and
// simulates the step on an H100-like cluster. It links hdp_planning and
// hdp_whatif only, and planner_links_alone (tests/planner_links_alone_test.sh)
// reads its link command to show that this pulls in no kernels and no runtime.
// Exits 0 when every step succeeds and the results are sane, 1 otherwise.

#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include "planning/hdp_planner.h"
#include "planning/plan.h"
#include "whatif/hardware.h"
#include "whatif/step_simulation.h"

int main() {
  using namespace hdp;
  try {
    const ModelShape model{.name = "llama-7b", .layers = 32, .hidden = 4096, .heads = 32, .kv_heads = 32,
                           .head_dim = 128, .ffn = 11008, .vocab = 32000};
    HardwareProfile h100;
    h100.name = "h100";
    h100.peak_flops = 989.4e12;
    h100.achievable_fraction = 0.5;
    h100.hbm_bytes = 80e9;
    h100.hbm_bytes_per_s = 3.35e12;
    h100.reserved_bytes = 6e9;
    h100.nvlink_bytes_per_s = 450e9;
    h100.internode_bytes_per_s = 50e9;
    h100.intranode_latency_s = 3e-6;
    h100.internode_latency_s = 10e-6;
    h100.pcie_bytes_per_s = 64e9;
    validate_hardware(h100);
    const ParallelDegrees degrees{.tp = 1, .pp = 1, .hdp = 8};
    const std::vector<int64_t> stage_layers = {model.layers};
    const StepCosts costs = make_step_costs(model, h100, degrees, stage_layers);

    PlannerSettings settings;
    settings.hdp = degrees.hdp;
    settings.capacity = 8192;
    settings.layers_per_stage = model.layers;
    settings.cost = costs.cost;
    const std::vector<int64_t> lengths = {40000, 9000, 6000, 3000, 2500, 1800, 1200, 900, 700, 500, 300, 200, 100, 64};
    const StepPlan plan = plan_balance(lengths, settings, BalanceSettings{});
    check_plan(plan, lengths, settings.layers_per_stage, settings.pipeline_stages);
    size_t micro_batches = 0;
    for (int rank = 0; rank < degrees.hdp; ++rank) micro_batches += rank_work(plan, lengths, rank).size();
    const StepSimulation step = simulate_step(plan, lengths, costs);
    std::printf("plan_only: %zu micro-batches, %zu rings, simulated step %.4f s, idle %.1f%%\n", micro_batches,
                plan.rings.size(), step.step_seconds, 100 * step.idle_fraction);
    const bool sane = micro_batches > 0 && !plan.rings.empty() && std::isfinite(step.step_seconds) &&
                      step.step_seconds > 0 && step.idle_fraction >= 0 && step.idle_fraction < 1;
    return sane ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_only: %s\n", e.what());
    return 1;
  }
}
