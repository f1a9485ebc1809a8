#include "whatif/step_measure.h"

#include <limits>

#include "whatif/simulator.h"

namespace hdp {

double simulated_step_seconds(const StepPlan& plan, std::span<const int64_t> lengths, const StepCosts& costs) {
  try {
    return simulate_step(plan, lengths, costs).step_seconds;
  } catch (const sim::SimulationError&) {
    return std::numeric_limits<double>::infinity();
  }
}

std::function<double(const StepPlan&)> simulated_step_measure(std::span<const int64_t> lengths,
                                                              const StepCosts& costs) {
  return [lengths, &costs](const StepPlan& plan) { return simulated_step_seconds(plan, lengths, costs); };
}

std::function<std::vector<std::vector<double>>(const StepPlan&)> simulated_micro_batch_measure(
    std::span<const int64_t> lengths, const StepCosts& costs) {
  return [lengths, &costs](const StepPlan& plan) {
    try {
      return simulate_step(plan, lengths, costs).micro_batch_seconds;
    } catch (const sim::SimulationError&) {
      return std::vector<std::vector<double>>{};
    }
  };
}

}  // namespace hdp
