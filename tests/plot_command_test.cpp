// `trainer plot`: SVG charts from metrics.jsonl, two runs on one chart, and its
// errors (a directory without metrics, a broken line) with exit code 2.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"
#include "trainer/svg.h"

namespace hdp {
namespace {

using testing::run_trainer;
using testing::scratch_dir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void write_run(const std::string& dir, double loss0) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir + "/metrics.jsonl");
  for (int step = 1; step <= 5; ++step) {
    out << "{\"step\": " << step << ", \"loss\": " << loss0 / step << ", \"tokens_per_s\": " << 1000 * step
        << ", \"mfu\": 0.25, \"grad_norm\": 1.5, \"idle_fraction\": 0.1, \"busy_ms\": [10, " << 12 + step << "]}\n";
  }
}

TEST(PlotCommand, TwoRunsOnOneChart) {
  const std::string dir = scratch_dir("plot_runs");
  write_run(dir + "/base", 5.0);
  write_run(dir + "/balanced", 4.0);
  const auto r = run_trainer("plot " + dir + "/base " + dir + "/balanced --output " + dir + "/charts");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* chart : {"loss", "throughput", "mfu", "grad_norm", "idle", "busy"}) {
    const std::string svg = slurp(dir + "/charts/" + chart + ".svg");
    EXPECT_NE(svg.find("<svg"), std::string::npos) << chart;
  }
  const std::string loss = slurp(dir + "/charts/loss.svg");
  EXPECT_EQ(count(loss, "<polyline"), 2u);
  EXPECT_NE(loss.find(">base<"), std::string::npos);
  EXPECT_NE(loss.find(">balanced<"), std::string::npos);
  // 5 points per run.
  const size_t first = loss.find("points=\"");
  const size_t end = loss.find('"', first + 8);
  EXPECT_EQ(count(loss.substr(first, end - first), ","), 5u);
  const std::string busy = slurp(dir + "/charts/busy.svg");
  EXPECT_EQ(count(busy, "<polyline"), 4u);  // 2 runs x 2 ranks
  EXPECT_NE(busy.find("balanced rank 1"), std::string::npos);
}

std::vector<std::string> labels(const AxisTicks& t) {
  std::vector<std::string> out;
  for (double v : t.values) out.push_back(tick_label(v, t.step));
  return out;
}

// Ticks at 1-2-5 steps with the digits the step needs: no "7.627", "0.9915" or
// "1.964e+04" on an axis.
TEST(PlotTicks, RoundStepsAndShortLabels) {
  using V = std::vector<std::string>;
  const AxisTicks loss = nice_ticks(2.31, 7.627);
  EXPECT_EQ(loss.step, 2);
  EXPECT_EQ(loss.lo, 2);
  EXPECT_EQ(loss.hi, 8);
  EXPECT_EQ(labels(loss), (V{"2", "4", "6", "8"}));
  EXPECT_EQ(labels(nice_ticks(12000, 19640)), (V{"12k", "14k", "16k", "18k", "20k"}));
  EXPECT_EQ(labels(nice_ticks(0.9915, 0.999)), (V{"0.990", "0.992", "0.994", "0.996", "0.998", "1.000"}));
  EXPECT_EQ(labels(nice_ticks(0, 2e-4)), (V{"0", "5e-05", "1.0e-04", "1.5e-04", "2.0e-04"}));
  EXPECT_EQ(labels(nice_ticks(0, 2.5e6)), (V{"0", "0.5M", "1.0M", "1.5M", "2.0M", "2.5M"}));
  EXPECT_EQ(labels(nice_ticks(-0.25, 0.25)), (V{"-0.3", "-0.2", "-0.1", "0", "0.1", "0.2", "0.3"}));
}

TEST(PlotCommand, BadRunsExitTwo) {
  const std::string dir = scratch_dir("plot_bad");
  auto r = run_trainer("plot " + dir + "/nothing-here");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nothing-here/metrics.jsonl"), std::string::npos) << r.output;
  std::filesystem::create_directories(dir + "/broken");
  std::ofstream(dir + "/broken/metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\n";
  r = run_trainer("plot " + dir + "/broken");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("broken/metrics.jsonl:2: not JSON"), std::string::npos) << r.output;
  // A number no double holds is the JSON library's out_of_range, not a parse error.
  std::ofstream(dir + "/broken/metrics.jsonl") << "{\"step\": 1, \"loss\": 1e400}\n";
  r = run_trainer("plot " + dir + "/broken");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("broken/metrics.jsonl:1: not JSON"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hdp
