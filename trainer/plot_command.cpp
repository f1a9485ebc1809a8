// `trainer plot RUN_DIR...`: SVG charts of metrics.jsonl (run/metrics.h):
// loss, throughput, MFU, gradient norm, and per-rank busy time and the idle
// fraction, several runs on one chart for comparison (trainer/svg.h).

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/command_line.h"
#include "trainer/commands.h"
#include "trainer/svg.h"

namespace hdp {
namespace {

const char* const kPlotHelp = R"(usage: trainer plot RUN_DIR... [--output DIR]

Draws RUN_DIR/metrics.jsonl as SVG charts: loss.svg, throughput.svg (tokens/s),
mfu.svg, grad_norm.svg, busy.svg (each rank's busy milliseconds per step) and
idle.svg (the idle fraction). Several runs go on the same charts, one colour each.
  --output DIR   where the charts go (default: the first RUN_DIR/plots)
)";

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

struct Run {
  std::string name;
  std::vector<nlohmann::json> steps;
};

Run read_run(const std::string& dir) {
  const std::string path = dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open the run's metrics (is " + dir + " a run directory?)");
  Run run;
  run.name = std::filesystem::path(dir).filename().string();
  if (run.name.empty()) run.name = std::filesystem::path(dir).parent_path().filename().string();
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      run.steps.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
      throw InputError(path + ":" + std::to_string(n) + ": not JSON (" + e.what() + ")");
    }
    if (!run.steps.back().is_object() || !run.steps.back().contains("step"))
      throw InputError(path + ":" + std::to_string(n) + ": expected a step record with \"step\"");
  }
  if (run.steps.empty()) throw InputError(path + ": no steps recorded yet");
  return run;
}

// One chart: x = step, y = the value; a legend names each series.
void line_chart(const std::string& path, const std::string& title, const std::string& y_label,
                const std::vector<Series>& series) {
  const double width = 720, height = 420, left = 80, right = 20, top = 40, bottom = 60;
  const double legend = 18.0 * static_cast<double>(series.size());
  Svg svg(width, height + legend);
  svg.text(width / 2, 22, title, 15, "middle");
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  const double pw = width - left - right, ph = height - top - bottom;
  svg.rect(left, top, pw, ph, "none", "", "#999999");
  if (!std::isfinite(x0)) {
    svg.text(left + pw / 2, top + ph / 2, "no values", 13, "middle");
    svg.save(path);
    return;
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {
    y0 -= 0.5 * std::max(std::abs(y0), 1e-9);
    y1 += 0.5 * std::max(std::abs(y1), 1e-9);
  }
  // y: the range widened to round ticks; x: the steps run, ticked at whole round steps inside them.
  const AxisTicks y_ticks = nice_ticks(y0, y1);
  y0 = y_ticks.lo;
  y1 = y_ticks.hi;
  AxisTicks x_ticks = nice_ticks(x0, x1, 8);
  if (x_ticks.step < 1) x_ticks = nice_ticks(std::floor(x0), std::floor(x0) + 5);
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - y0) / (y1 - y0) * ph; };
  size_t widest = 0;  // characters of the longest y tick label
  for (double y : y_ticks.values) {
    const std::string label = tick_label(y, y_ticks.step);
    widest = std::max(widest, label.size());
    svg.line(left, py(y), left + pw, py(y), "#eeeeee");
    svg.text(left - 6, py(y) + 4, label, 11, "end");
  }
  for (double x : x_ticks.values) {
    if (x < x0 - 1e-9 || x > x1 + 1e-9) continue;
    svg.text(px(x), top + ph + 16, tick_label(x, x_ticks.step), 11, "middle");
  }
  svg.text(left + pw / 2, top + ph + 36, "step", 12, "middle");
  // The y label left of the widest tick label (about 0.6 em a character at 11 px), not over it.
  const double label_x = std::max(12.0, left - 6 - 6.6 * static_cast<double>(widest) - 10);
  svg.text(label_x, top + ph / 2, y_label, 12, "middle", -90);
  for (size_t i = 0; i < series.size(); ++i) {
    std::vector<std::pair<double, double>> points;
    for (const auto& [x, y] : series[i].points)
      if (std::isfinite(y)) points.emplace_back(px(x), py(y));
    svg.polyline(points, series_colour(static_cast<int>(i)));
    const double ly = height + 18.0 * static_cast<double>(i);
    svg.line(left, ly - 4, left + 24, ly - 4, series_colour(static_cast<int>(i)), 3);
    svg.text(left + 30, ly, series[i].name, 12);
  }
  svg.save(path);
}

Series scalar(const Run& run, const char* key, double scale = 1.0) {
  Series s{run.name, {}};
  for (const nlohmann::json& j : run.steps) {
    const auto it = j.find(key);
    if (it != j.end() && it->is_number()) s.points.emplace_back(j["step"].get<double>(), it->get<double>() * scale);
  }
  return s;
}

int plot(Arguments& args) {
  const std::optional<std::string> output = args.option("--output");
  const std::vector<std::string> dirs = args.positional();
  args.expect_empty();
  if (dirs.empty()) throw UsageError("expects at least one RUN_DIR (a directory with metrics.jsonl)");
  std::vector<Run> runs;
  for (const std::string& d : dirs) runs.push_back(read_run(d));
  const std::string out = output ? *output : dirs[0] + "/plots";
  std::filesystem::create_directories(out);

  struct Chart { const char* file; const char* title; const char* label; const char* key; double scale; };
  const Chart charts[] = {{"loss.svg", "training loss", "loss", "loss", 1.0},
                          {"throughput.svg", "throughput", "tokens / s", "tokens_per_s", 1.0},
                          {"mfu.svg", "model FLOPs utilisation", "MFU (%)", "mfu", 100.0},
                          {"grad_norm.svg", "gradient norm (before clipping)", "grad norm", "grad_norm", 1.0},
                          {"idle.svg", "idle fraction of the ranks' step time", "idle (%)", "idle_fraction", 100.0}};
  for (const Chart& c : charts) {
    std::vector<Series> series;
    for (const Run& r : runs) series.push_back(scalar(r, c.key, c.scale));
    line_chart(out + "/" + c.file, c.title, c.label, series);
  }
  // Per-rank busy time: one line per rank of each run.
  std::vector<Series> busy;
  for (const Run& r : runs) {
    for (const nlohmann::json& j : r.steps) {
      const auto it = j.find("busy_ms");
      if (it == j.end() || !it->is_array()) continue;
      for (size_t rank = 0; rank < it->size(); ++rank) {
        const std::string name = r.name + " rank " + std::to_string(rank);
        auto s = std::find_if(busy.begin(), busy.end(), [&](const Series& x) { return x.name == name; });
        if (s == busy.end()) s = busy.insert(busy.end(), Series{name, {}});
        if ((*it)[rank].is_number()) s->points.emplace_back(j["step"].get<double>(), (*it)[rank].get<double>());
      }
    }
  }
  line_chart(out + "/busy.svg", "busy time per rank", "busy (ms)", busy);
  std::printf("plot: %zu run(s) -> %s/{loss,throughput,mfu,grad_norm,idle,busy}.svg\n", runs.size(), out.c_str());
  return kExitSuccess;
}

}  // namespace

int command_plot(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kPlotHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("plot", [&] { return plot(args); });
}

}  // namespace hdp
