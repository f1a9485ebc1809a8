#pragma once
// The step simulator (whatif/step_simulation.h) as the balance scheduler's measure
// (BalanceSettings::step_seconds, planning/hdp_planner.h): `trainer plan` and the
// trainer's step planner (run/step_planner.h) compare their candidate plans by it,
// and the trainer records it for the plan it runs (metrics.jsonl's planned_step_ms).

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "planning/plan.h"
#include "whatif/step_simulation.h"

namespace hdp {

// The simulated step of `plan` over these sequences and costs; a layout whose rings
// deadlock (sim::SimulationError: a ring's members reach it in orders that wait on
// each other) takes forever, so that it never wins a comparison.
double simulated_step_seconds(const StepPlan& plan, std::span<const int64_t> lengths, const StepCosts& costs);

// simulated_step_seconds of one step's sequences as a measure of plans. The
// sequences and the costs are referred to, not copied: they must outlive it.
std::function<double(const StepPlan&)> simulated_step_measure(std::span<const int64_t> lengths,
                                                              const StepCosts& costs);

// Each rank's micro-batches' simulated seconds (StepSimulation::micro_batch_seconds) as
// the balance scheduler's re-timing measure (BalanceSettings::micro_batch_seconds);
// empty for a layout whose rings deadlock. The same references as above.
std::function<std::vector<std::vector<double>>(const StepPlan&)> simulated_micro_batch_measure(
    std::span<const int64_t> lengths, const StepCosts& costs);

}  // namespace hdp
