// `trainer plot`: SVG charts from metrics.jsonl, two runs on one chart, and its
// errors (a directory without metrics, a broken line) with exit code 2.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"

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
}

}  // namespace
}  // namespace hdp
