#include "trainer/ettr.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

namespace hdp {

std::vector<StepTiming> read_step_timings(const std::string& metrics_path) {
  std::vector<StepTiming> steps;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;  // a line cut short by a crash
    const auto step = record.find("step");
    const auto time = record.find("time");
    const auto step_ms = record.find("step_ms");
    if (step == record.end() || time == record.end() || step_ms == record.end()) continue;
    if (!step->is_number_integer() || !time->is_number() || !step_ms->is_number()) continue;
    steps.push_back({step->get<int64_t>(), time->get<double>(), step_ms->get<double>() / 1e3});
  }
  return steps;
}

double effective_seconds(const std::vector<StepTiming>& steps, int64_t last_kept_step, double from_s, double to_s) {
  double total = 0;
  for (const StepTiming& s : steps) {
    if (s.step > last_kept_step) continue;
    const double begin = std::max(from_s, s.end_s - s.duration_s);
    const double end = std::min(to_s, s.end_s);
    if (end > begin) total += end - begin;
  }
  return total;
}

Ettr ettr_between(const std::vector<StepTiming>& steps, int64_t last_kept_step, double from_s, double to_s) {
  Ettr e;
  e.wall_s = std::max(0.0, to_s - from_s);
  e.effective_s = effective_seconds(steps, last_kept_step, from_s, to_s);
  e.ratio = e.wall_s > 0 ? e.effective_s / e.wall_s : 0.0;
  return e;
}

}  // namespace hdp
