// The op tracer in a real run (run/step_tracer.h, parallel/op_tracer.h) and
// the analysis on its files: a pp 2 x hdp 2 tiny-llama run with one rank slowed
// by HDP_SLOW_RANK is traced, analysed, and blamed on that rank; an untouched
// run's replay reproduces its measured step time within 5% (the bound Lin et al.,
// OSDI 2025, keep their simulation to); the per-rank files merge into one
// Perfetto trace; bad trace settings and knob values exit 2.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "test_util.h"
#include "trainer_runs.h"

namespace hdp {
namespace {

using testing::file_text;
using testing::run_command;
using testing::run_trainer;
using testing::scratch_dir;

// The tiny-llama model on short sequences: 8 micro-batches of 256 tokens per
// step over 2 DP ranks, 2 stages of 2 layers.
// `mpirun_options` go before the trainer binary (e.g. "-x HDP_SLOW_RANK").
std::string traced_run(const std::string& run_dir, const std::string& mpirun_options) {
  std::string launch = testing::mpirun(4);
  launch.insert(launch.find(" --oversubscribe"), " " + mpirun_options);
  return launch + " train " + std::string(HDP_SOURCE_DIR) +
         "/configs/tiny-llama.yaml --set data.path=" + testing::small_corpus() +
         " --set parallel.pp=2 --set parallel.hdp=2 --set train.steps=5 --set train.threads=1"
         " --set train.peak_flops=1e11 --set data.max_seq_len=128 --set data.micro_batch_tokens=256"
         " --set data.global_batch_tokens=2048 --set train.checkpoint_every=0 --set trace.every=1"
         " --set train.run_dir=" + run_dir;
}

nlohmann::json analyze(const std::string& run_dir) {
  const auto r = run_trainer("analyze " + run_dir + "/trace --output " + run_dir + "/report.json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(file_text(run_dir + "/report.json"));
}

TEST(TraceRun, SlowRankIsBlamed) {
  const std::string dir = scratch_dir("trace_slow");
  // World rank 3 is tp 0, pp 1, hdp 1 (rank = tp + tp (hdp + hdp pp)).
  const auto run = run_command("HDP_SLOW_RANK=3:3 " + traced_run(dir, "-x HDP_SLOW_RANK") + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::set<std::string> ops;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string path = dir + "/trace/rank-0000" + std::to_string(rank) + ".jsonl";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    int lines = 0;
    for (std::string line; std::getline(in, line); ++lines) {
      const nlohmann::json j = nlohmann::json::parse(line);
      EXPECT_EQ(j["rank"], rank);
      ops.insert(j["op"].get<std::string>());
    }
    EXPECT_GT(lines, 5 * 10) << path;  // 5 steps of 8 micro-batches and more
  }
  for (const char* op : {"forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send",
                         "backward-recv", "grads-sync", "params-sync", "optimizer", "data-wait"})
    EXPECT_TRUE(ops.count(op)) << op;

  const nlohmann::json report = analyze(dir);
  EXPECT_EQ(report["steps"], 5);
  EXPECT_EQ(report["cause"], "slow-worker") << report["verdict"];
  EXPECT_EQ(report["worst_workers"][0]["pp_rank"], 1);
  EXPECT_EQ(report["worst_workers"][0]["dp_rank"], 1);
  EXPECT_GT(report["mw"].get<double>(), 0.5);
  EXPECT_GT(report["slowdown"].get<double>(), 1.3);
  EXPECT_LT(report["replay_error"].get<double>(), 0.05);
}

TEST(TraceRun, UntouchedRunReplaysItsStepTime) {
  const std::string dir = scratch_dir("trace_clean");
  const auto run = run_command(traced_run(dir, "") + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json report = analyze(dir);
  EXPECT_EQ(report["pp"], 2);
  EXPECT_EQ(report["dp"], 2);
  EXPECT_LT(report["replay_error"].get<double>(), 0.05)
      << "measured " << report["measured_step_us"] << " us, replayed " << report["step_us"] << " us";

  const auto merged = run_trainer("trace merge " + dir + "/trace --output " + dir + "/merged.json");
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  const nlohmann::json trace = nlohmann::json::parse(file_text(dir + "/merged.json"));
  std::set<int> pids;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));
}

TEST(TraceRun, OffWritesNothingAndBadSettingsExitTwo) {
  const std::string dir = scratch_dir("trace_off");
  const std::string base = "train " + std::string(HDP_SOURCE_DIR) + "/configs/tiny-llama.yaml --set data.path=" +
                           testing::small_corpus() + testing::small_model_overrides() +
                           " --set train.steps=1 --set train.checkpoint_every=0 --set train.run_dir=" + dir;
  auto r = run_trainer(base);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/trace"));
  r = run_trainer(base + " --set trace.every=2 --set trace.steps=3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("trace.steps"), std::string::npos) << r.output;
  r = run_command("HDP_SLOW_RANK=three " + std::string(HDP_TRAINER_BINARY) + " " + base + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("HDP_SLOW_RANK=three: expected RANK:FACTOR"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hdp
