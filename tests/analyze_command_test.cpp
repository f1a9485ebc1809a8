// `trainer analyze` and `trainer trace merge` end to end through the binary: an
// imported trace written by hand in the JSONL format of docs/tracing.md (the
// hand-computed answer: T = 450 us, T_ideal = 400 us, S = 1.125, DP rank 1's
// backward to blame), its JSON report, heatmap and ideal timeline, and malformed
// traces refused with exit code 2 naming file and line.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "test_util.h"

namespace hdp {
namespace {

using testing::run_trainer;
using testing::scratch_dir;

// Two micro-batches through a 2-stage pipeline, one DP rank, with the sends and
// receives another trainer would record, small enough to check by hand: stage
// 1's second backward takes 60 us instead of 20. Extra fields ("gpu") are ignored.
const char* const kImported =
    R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"forward-compute","start_us":0,"end_us":10,"group":null,"gpu":"h100-07"}
{"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"forward-send","start_us":10,"end_us":12,"group":"f0"}
{"step":0,"microbatch":0,"pp_rank":1,"dp_rank":0,"op":"forward-recv","start_us":0,"end_us":12,"group":"f0"}
{"step":0,"microbatch":0,"pp_rank":1,"dp_rank":0,"op":"forward-compute","start_us":12,"end_us":22,"group":null}
{"step":0,"microbatch":0,"pp_rank":1,"dp_rank":0,"op":"backward-compute","start_us":22,"end_us":42,"group":null}
{"step":0,"microbatch":0,"pp_rank":1,"dp_rank":0,"op":"backward-send","start_us":42,"end_us":44,"group":"b0"}
{"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"backward-recv","start_us":10,"end_us":44,"group":"b0"}
{"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"backward-compute","start_us":44,"end_us":64,"group":null}
{"step":0,"microbatch":1,"pp_rank":1,"dp_rank":0,"op":"backward-compute","start_us":42,"end_us":102,"group":null}
{"step":0,"microbatch":1,"pp_rank":0,"dp_rank":0,"op":"backward-compute","start_us":104,"end_us":124,"group":null}
{"step":0,"microbatch":1,"pp_rank":1,"dp_rank":0,"op":"backward-send","start_us":102,"end_us":104,"group":"b1"}
{"step":0,"microbatch":1,"pp_rank":0,"dp_rank":0,"op":"backward-recv","start_us":44,"end_us":104,"group":"b1"}
)";

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(AnalyzeCommand, ImportedTraceEndToEnd) {
  const std::string dir = scratch_dir("analyze_imported");
  // One stage-pair pipeline, micro-batch 1's forward pass omitted on purpose:
  // a trace need not hold every op. Replay by hand (us):
  //   stage 0: fwd0 [0,10], send f0 [10,12]; stage 1: recv f0 ends 12, fwd0 [12,22],
  //   bwd0 [22,42], send b0 -> stage 0 recv ends 44, bwd0 [44,64];
  //   stage 1 bwd1 [42,102] (slow), send b1 ends 104, stage 0 bwd1 [104,124].
  // Ideal: backward-compute mean (20+20+60+20)/4 = 30: stage 1 bwd1 [52,82]
  //   (after bwd0 at [22,52]), sends 2, stage 0 bwd0 [54,84], bwd1 [84,114]: T_ideal = 114.
  const std::string trace = write_file(dir, "imported.jsonl", kImported);
  const auto r = run_trainer("analyze " + trace + " --output " + dir + "/report.json --heatmap " + dir +
                             "/heat.svg --timeline " + dir + "/ideal.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("verdict:"), std::string::npos) << r.output;
  const nlohmann::json report = nlohmann::json::parse(slurp(dir + "/report.json"));
  EXPECT_NEAR(report["measured_step_us"].get<double>(), 124, 1e-9);
  EXPECT_NEAR(report["step_us"].get<double>(), 124, 1e-9);
  EXPECT_NEAR(report["ideal_step_us"].get<double>(), 114, 1e-9);
  EXPECT_NEAR(report["slowdown"].get<double>(), 124.0 / 114.0, 1e-9);
  EXPECT_EQ(report["pp"], 2);
  EXPECT_EQ(report["dp"], 1);
  bool saw_backward = false;
  for (const auto& t : report["op_types"]) {
    if (t["op"] == "backward-compute") {
      saw_backward = true;
      EXPECT_NEAR(t["ideal_us"].get<double>(), 30, 1e-9);
      EXPECT_NEAR(t["slowdown"].get<double>(), 124.0 / 114.0, 1e-9);
    }
    if (t["op"] == "forward-send") {
      EXPECT_TRUE(t["communication"].get<bool>());
    }
  }
  EXPECT_TRUE(saw_backward);
  // The slow backward is on stage 1, the last. Only stage 1 recorded: its
  // backwards 20 and 60, stage 0's the ideal 30: T = 104 + 30 = 134. Only stage 0
  // recorded: its backwards take 20 instead of 30: T = 104 (faster than ideal).
  EXPECT_NEAR(report["pp_slowdown"][1].get<double>(), 134.0 / 114.0, 1e-9);
  EXPECT_NEAR(report["pp_slowdown"][0].get<double>(), 104.0 / 114.0, 1e-9);
  EXPECT_EQ(report["worst_workers"][0]["pp_rank"], 1);
  // Stage 1 made ideal: T = 104, so it explains (124 - 104) / (124 - 114) = 2x the loss.
  EXPECT_NEAR(report["ms"].get<double>(), 2.0, 1e-9);
  EXPECT_NEAR(report["mw"].get<double>(), 2.0, 1e-9);
  EXPECT_EQ(report["cause"], "slow-worker");
  const std::string svg = slurp(dir + "/heat.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("pp 1 dp 0: 1.088"), std::string::npos) << svg;
  const nlohmann::json ideal = nlohmann::json::parse(slurp(dir + "/ideal.json"));
  double last_end = 0;
  for (const auto& e : ideal["traceEvents"])
    if (e["ph"] == "X") last_end = std::max(last_end, e["ts"].get<double>() + e["dur"].get<double>());
  EXPECT_NEAR(last_end, 114, 0.01);
}

TEST(AnalyzeCommand, MalformedTraceExitsTwoNamingFileAndLine) {
  const std::string dir = scratch_dir("analyze_bad");
  std::string text = kImported;
  text += R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"optimizer","start_us":130})" "\n";
  const std::string trace = write_file(dir, "bad.jsonl", text);
  auto r = run_trainer("analyze " + trace);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(trace + ":13: missing field \"end_us\""), std::string::npos) << r.output;
  r = run_trainer("analyze " + write_file(dir, "notjson.jsonl", "not json\n"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("notjson.jsonl:1: not JSON"), std::string::npos) << r.output;
  r = run_trainer("analyze " + dir + "/missing.jsonl");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_trainer("analyze");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// One line with a rank far beyond the trace's others (dp_rank 100000000) would
// size the analysis's per-worker tables by it, and a rank beyond 32 bits would be
// cut to another rank: both are refused with exit code 2 naming file, line and
// field, by `analyze` and `trace merge` alike.
TEST(AnalyzeCommand, RanksBeyondWhatTheTraceHoldsExitTwoNamingTheField) {
  const std::string dir = scratch_dir("analyze_ranks");
  const std::string far = write_file(
      dir, "far.jsonl",
      std::string(kImported) +
          R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":100000000,"op":"optimizer","start_us":130,"end_us":131,"group":null})"
          "\n");
  auto r = run_trainer("analyze " + far);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(far + ":13: \"dp_rank\" is 100000000: the ranks of the trace (largest pp_rank 1, dp_rank "
                                "100000000, tp_rank 0) span 2e+08 workers, more than the 13 operations it holds"),
            std::string::npos) << r.output;
  r = run_trainer("trace merge " + far + " --output " + dir + "/merged.json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(far + ":13: \"dp_rank\" is 100000000"), std::string::npos) << r.output;
  const std::string wide = write_file(
      dir, "wide.jsonl",
      std::string(kImported) +
          R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":4294967297,"op":"optimizer","start_us":130,"end_us":131,"group":null})"
          "\n");
  r = run_trainer("analyze " + wide);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(wide + ":13: \"dp_rank\" is 4294967297; it must be at most 2147483647"), std::string::npos)
      << r.output;
}

TEST(AnalyzeCommand, TraceMergeWritesOneTrackPerRankAndStream) {
  const std::string dir = scratch_dir("trace_merge");
  std::filesystem::create_directories(dir + "/trace");
  write_file(dir + "/trace", "rank-0.jsonl", kImported);
  const auto r = run_trainer("trace merge " + dir + "/trace --output " + dir + "/merged.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json merged = nlohmann::json::parse(slurp(dir + "/merged.json"));
  int events = 0, threads = 0;
  for (const auto& e : merged["traceEvents"]) {
    if (e["ph"] == "X") ++events;
    if (e["name"] == "thread_name") ++threads;
  }
  EXPECT_EQ(events, 12);
  EXPECT_EQ(threads, 6);  // stage 0: compute, fsend, brecv; stage 1: frecv, compute, bsend
  EXPECT_EQ(run_trainer("trace frobnicate").exit_code, 2);
}

}  // namespace
}  // namespace hdp
