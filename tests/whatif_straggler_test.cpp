// The what-if straggler analysis (whatif/straggler_analysis.h) on traces with a
// known answer: synthetic 1F1B pipeline x DP jobs (whatif/synthetic_trace.h)
// built by replaying a chosen op graph, so the analysis must recover what was
// put in (Lin et al., "Understanding Stragglers in Large Model Training Using
// What-if Analysis", OSDI 2025): a clean job replays at S = 1, one slow worker
// leads the heatmap and explains most of the loss (M_W), a heavy last stage
// shows in M_S, skewed sequence lengths in the forward/backward correlation.
// Also the JSONL reader and its errors, and the compiled replay against the
// plain one.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "whatif/simulator.h"
#include "whatif/straggler_analysis.h"
#include "whatif/synthetic_trace.h"
#include "whatif/trace.h"
#include "test_util.h"

namespace hdp {
namespace {

SyntheticJob job() {
  SyntheticJob j;
  j.pp = 4;
  j.dp = 8;
  j.micro_batches = 8;
  j.steps = 4;
  return j;
}

TEST(StragglerAnalysis, NoiseFreeTraceReplaysExactly) {
  const StragglerReport r = analyze_stragglers(synthesize_trace(job()));
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.pp, 4);
  EXPECT_EQ(r.dp, 8);
  EXPECT_NEAR(r.slowdown, 1.0, 1e-9);
  // The replay with recorded durations reproduces the recorded step.
  EXPECT_NEAR(r.step_us, r.measured_step_us, 1e-6 * r.measured_step_us);
  EXPECT_EQ(r.cause, StragglerCause::None);
  // With instant transfers, 1F1B over 4 stages and 8 micro-batches of 1000 + 2000
  // us takes (8 + 3) x 3000 us, then the tail: grads-sync, optimizer, params-sync.
  SyntheticJob instant = job();
  instant.transfer_us = 0;
  EXPECT_NEAR(analyze_stragglers(synthesize_trace(instant)).step_us, 11 * 3000 + 400 + 200 + 300, 1e-6);
}

TEST(StragglerAnalysis, CleanTraceWithJitterIsWithinOnePercent) {
  SyntheticJob j = job();
  j.noise = 0.03;
  const StragglerReport r = analyze_stragglers(synthesize_trace(j));
  EXPECT_NEAR(r.slowdown, 1.0, 0.01) << straggler_report_table(r);
  EXPECT_LT(r.replay_error, 1e-6);
  EXPECT_EQ(r.cause, StragglerCause::None) << r.verdict;
  EXPECT_LT(r.correlation, 0.5);  // independent jitter: passes do not correlate
}

TEST(StragglerAnalysis, OneSlowWorkerLeadsTheHeatmap) {
  SyntheticJob j = job();
  j.noise = 0.02;
  j.slow_pp = 1;
  j.slow_dp = 2;
  j.slow_factor = 2.0;
  const StragglerReport r = analyze_stragglers(synthesize_trace(j));
  ASSERT_FALSE(r.worst_workers.empty());
  EXPECT_EQ(r.worst_workers.size(), 1u);  // 3% of 32 workers, at least one
  EXPECT_EQ(r.worst_workers[0].pp_rank, 1);
  EXPECT_EQ(r.worst_workers[0].dp_rank, 2);
  const double top = r.worker_score[1 * 8 + 2];
  for (size_t w = 0; w < r.worker_score.size(); ++w)
    if (w != 1 * 8 + 2) {
      EXPECT_LT(r.worker_score[w], top - 0.2) << "worker " << w;
    }
  EXPECT_GT(r.mw, 0.5);
  EXPECT_GT(r.slowdown, 1.5);
  EXPECT_EQ(r.cause, StragglerCause::SlowWorker) << r.verdict;
  EXPECT_NE(r.verdict.find("pp 1 dp 2"), std::string::npos) << r.verdict;
  // Compute is to blame, not communication.
  for (const OpTypeReport& t : r.op_types)
    if (t.communication) {
      EXPECT_LT(t.slowdown, 1.05) << t.name;
    }
}

TEST(StragglerAnalysis, HeavyLastStageShowsInMS) {
  SyntheticJob j = job();
  j.noise = 0.02;
  j.last_stage_factor = 2.5;
  const StragglerReport r = analyze_stragglers(synthesize_trace(j));
  EXPECT_GT(r.ms, 0.5) << straggler_report_table(r);
  EXPECT_LT(r.mw, 0.5);
  EXPECT_GT(r.slowdown, 1.2);
  EXPECT_EQ(r.cause, StragglerCause::LastStage) << r.verdict;
  const auto worst_stage = std::max_element(r.pp_slowdown.begin(), r.pp_slowdown.end()) - r.pp_slowdown.begin();
  EXPECT_EQ(worst_stage, 3);
  // Every DP rank has a last stage: the DP slowdowns are alike.
  const auto [lo, hi] = std::minmax_element(r.dp_slowdown.begin(), r.dp_slowdown.end());
  EXPECT_LT(*hi - *lo, 0.05);
}

TEST(StragglerAnalysis, SkewedSequenceLengthsCorrelateThePasses) {
  SyntheticJob j = job();
  j.noise = 0.02;
  j.sequence_skew = 0.6;
  const StragglerReport r = analyze_stragglers(synthesize_trace(j));
  EXPECT_GT(r.correlation, 0.9) << straggler_report_table(r);
  EXPECT_EQ(r.correlated_workers, 32);
  EXPECT_GT(r.slowdown, 1.05);
  EXPECT_EQ(r.cause, StragglerCause::SequenceImbalance) << r.verdict;
}

// A hand-computed trace: 1 stage, 2 DP ranks, DP rank 1's backward slow.
// Ideal: forward 100, backward mean 250, grads-sync median transfer 20
// (end minus the latest start, 400), optimizer 30: T = 450, T_ideal = 400.
const char* const kTwoRanks =
    R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"forward-compute","start_us":0,"end_us":100,"group":null}
{"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"backward-compute","start_us":100,"end_us":300,"group":null,"host":"a"}

{"step":0,"microbatch":-1,"pp_rank":0,"dp_rank":0,"op":"grads-sync","start_us":300,"end_us":420,"group":"rs"}
{"step":0,"microbatch":-1,"pp_rank":0,"dp_rank":0,"op":"optimizer","start_us":420,"end_us":450,"group":null}
{"step":0,"microbatch":0,"pp_rank":0,"dp_rank":1,"op":"forward-compute","start_us":0,"end_us":100,"group":null}
{"step":0,"microbatch":0,"pp_rank":0,"dp_rank":1,"op":"backward-compute","start_us":100,"end_us":400,"group":null}
{"step":0,"microbatch":-1,"pp_rank":0,"dp_rank":1,"op":"grads-sync","start_us":400,"end_us":420,"group":"rs"}
{"step":0,"microbatch":-1,"pp_rank":0,"dp_rank":1,"op":"optimizer","start_us":420,"end_us":450,"group":null}
)";

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(StragglerAnalysis, HandComputedTrace) {
  const std::string dir = testing::scratch_dir("straggler_hand");
  const Trace trace = read_traces({write_file(dir, "t.jsonl", kTwoRanks)});
  ASSERT_EQ(trace.ops.size(), 8u);
  const StragglerReport r = analyze_stragglers(trace);
  EXPECT_DOUBLE_EQ(r.measured_step_us, 450);
  EXPECT_NEAR(r.step_us, 450, 1e-6);
  EXPECT_NEAR(r.ideal_step_us, 400, 1e-6);
  EXPECT_NEAR(r.slowdown, 1.125, 1e-9);
  EXPECT_NEAR(r.dp_slowdown[0], 1.0, 1e-9);
  EXPECT_NEAR(r.dp_slowdown[1], 1.125, 1e-9);
  EXPECT_NEAR(r.mw, 1.0, 1e-9);
  for (const OpTypeReport& t : r.op_types) {
    if (t.name == "grads-sync") {
      EXPECT_TRUE(t.communication);
      EXPECT_NEAR(t.ideal_us, 20, 1e-9);
      EXPECT_NEAR(t.slowdown, 1.0, 1e-9);
    }
    if (t.name == "backward-compute") {
      EXPECT_NEAR(t.ideal_us, 250, 1e-9);
      EXPECT_NEAR(t.slowdown, 1.125, 1e-9);
    }
  }
  EXPECT_EQ(r.cause, StragglerCause::SlowWorker);
  EXPECT_NE(r.verdict.find("pp 0 dp 1"), std::string::npos) << r.verdict;
}

// NCCL operations' device times (device-*, parallel/device_ops.h) are reported, not
// replayed: a params all-gather finishing after the step's host ops, written after
// a later line, changes neither the measured nor the replayed step.
TEST(StragglerAnalysis, DeviceRecordsAreNestedAndLeaveTheStepAlone) {
  EXPECT_STREQ(trace_stream_name("device-grads-sync", false), "nested");
  EXPECT_STREQ(trace_stream_name("device-all-reduce", true), "nested");
  EXPECT_STREQ(trace_stream_name("grads-sync", true), "dp");
  const std::string dir = testing::scratch_dir("straggler_device");
  const std::string device =
      R"({"step":0,"microbatch":-1,"pp_rank":0,"dp_rank":0,"op":"device-grads-sync","start_us":310,"end_us":400,"group":null}
{"step":0,"microbatch":-1,"pp_rank":0,"dp_rank":1,"op":"device-params-sync","start_us":450,"end_us":900,"group":null}
)";
  const StragglerReport plain = analyze_stragglers(read_traces({write_file(dir, "plain.jsonl", kTwoRanks)}));
  const Trace trace = read_traces({write_file(dir, "device.jsonl", std::string(kTwoRanks) + device)});
  ASSERT_EQ(trace.ops.size(), 10u);
  const StragglerReport r = analyze_stragglers(trace);
  EXPECT_DOUBLE_EQ(r.measured_step_us, plain.measured_step_us);
  EXPECT_DOUBLE_EQ(r.step_us, plain.step_us);
  EXPECT_DOUBLE_EQ(r.ideal_step_us, plain.ideal_step_us);
  EXPECT_DOUBLE_EQ(r.slowdown, plain.slowdown);
  bool reported = false;
  for (const OpTypeReport& t : r.op_types) {
    if (t.name != "device-grads-sync") continue;
    reported = true;
    EXPECT_FALSE(t.replayed);
    EXPECT_FALSE(t.communication);
  }
  EXPECT_TRUE(reported);
}

void expect_trace_error(const std::string& text, const std::string& message) {
  const std::string dir = testing::scratch_dir("straggler_bad");
  const std::string path = write_file(dir, "bad.jsonl", text);
  try {
    read_traces({path});
    ADD_FAILURE() << "no error for " << text;
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":" + message), std::string::npos) << e.what();
  }
}

TEST(TraceReader, ErrorsNameFileAndLine) {
  const std::string ok =
      R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"forward-compute","start_us":0,"end_us":1,"group":null})"
      "\n";
  expect_trace_error(ok + "{\"step\":0\n", "2: not JSON");
  // A number beyond a double is nlohmann-json's out_of_range, not a parse_error (found by fuzz/trace_fuzz.cpp).
  expect_trace_error(ok + R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"x","start_us":1e400,"end_us":1,"group":null})" "\n",
                     "2: not JSON");
  expect_trace_error(ok + ok + "[1,2]\n", "3: expected one JSON object");
  expect_trace_error(
      ok + R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"x","start_us":0,"group":null})" "\n",
      "2: missing field \"end_us\"");
  expect_trace_error(R"({"step":-1,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"x","start_us":0,"end_us":1,"group":null})",
                     "1: \"step\" is -1");
  expect_trace_error(R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":"a","op":"x","start_us":0,"end_us":1,"group":null})",
                     "1: \"dp_rank\" must be an integer");
  expect_trace_error(R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"x","start_us":5,"end_us":1,"group":null})",
                     "1: end_us");
  expect_trace_error(R"({"step":0,"microbatch":0,"pp_rank":0,"dp_rank":0,"op":"x","start_us":0,"end_us":1,"group":3})",
                     "1: \"group\" must be a string or null");
  EXPECT_THROW(read_traces({testing::scratch_dir("straggler_empty")}), TraceError);
  EXPECT_THROW(read_traces({"/nonexistent/trace.jsonl"}), TraceError);
}

TEST(TraceReader, WrittenLinesReadBack) {
  std::ostringstream out;
  write_trace_line(out, 3, 1, 2, 5, 0, "forward-send", 10.5, 12.25, "s3/f/5/2/1", 9);
  out << "\n";
  write_trace_line(out, 3, -1, 2, 5, 1, "optimizer", 20, 21, "");
  out << "\n";
  EXPECT_EQ(out.str(),
            "{\"step\":3,\"microbatch\":1,\"pp_rank\":2,\"dp_rank\":5,\"tp_rank\":0,\"op\":\"forward-send\","
            "\"start_us\":10.500,\"end_us\":12.250,\"group\":\"s3/f/5/2/1\",\"rank\":9}\n"
            "{\"step\":3,\"microbatch\":-1,\"pp_rank\":2,\"dp_rank\":5,\"tp_rank\":1,\"op\":\"optimizer\","
            "\"start_us\":20.000,\"end_us\":21.000,\"group\":null}\n");
  const std::string dir = testing::scratch_dir("straggler_roundtrip");
  const Trace t = read_traces({write_file(dir, "r.jsonl", out.str())});
  ASSERT_EQ(t.ops.size(), 2u);
  EXPECT_EQ(t.ops[0].step, 3);
  EXPECT_EQ(t.ops[0].microbatch, 1);
  EXPECT_EQ(t.ops[0].pp_rank, 2);
  EXPECT_EQ(t.ops[0].dp_rank, 5);
  EXPECT_EQ(t.op_names[t.ops[0].op], "forward-send");
  EXPECT_DOUBLE_EQ(t.ops[0].start_us, 10.5);
  EXPECT_DOUBLE_EQ(t.ops[0].end_us, 12.25);
  EXPECT_GE(t.ops[0].group, 0);
  EXPECT_EQ(t.ops[1].group, -1);
  EXPECT_EQ(t.ops[1].tp_rank, 1);
}

// The compiled replay (what the analysis sweeps many times) gives the plain
// replay's times on a graph with groups.
TEST(StragglerAnalysis, ReplayPlanMatchesReplay) {
  sim::OpGraph g;
  const uint32_t op = g.label("op");
  const int a = g.add_stream(0, "c"), b = g.add_stream(1, "c"), ad = g.add_stream(0, "d"), bd = g.add_stream(1, "d");
  const int grp = g.new_group();
  const sim::OpId x = g.add_op(a, 3, op);
  const sim::OpId y = g.add_op(b, 5, op);
  g.add_op(ad, 2, op, {x}, grp);
  g.add_op(bd, 2, op, {y}, grp);
  g.add_op(a, 1, op, {static_cast<sim::OpId>(2)});
  const sim::Replay r = sim::replay(g);
  const sim::ReplayPlan plan(g);
  std::vector<double> start, end;
  EXPECT_DOUBLE_EQ(plan.sweep(g.durations(), start, end), r.makespan);
  EXPECT_DOUBLE_EQ(r.makespan, 8);  // the collective starts at 5, ends at 7, then 1
  EXPECT_EQ(start, r.start);
  EXPECT_EQ(end, r.end);
}

}  // namespace
}  // namespace hdp
