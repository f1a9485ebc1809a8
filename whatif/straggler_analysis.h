#pragma once
// What-if straggler analysis of an op trace (whatif/trace.h), the method of
// Lin et al., "Understanding Stragglers in Large Model Training Using What-if
// Analysis" (OSDI 2025, arXiv 2505.05713), on the replay engine of
// whatif/simulator.h.
//
// A worker is one (pp_rank, dp_rank); records with tp_rank > 0 are skipped
// (tensor-parallel peers run in lock step; tp rank 0 speaks for its group).
// Every step is one graph, replayed on its own (steps begin together):
// - Streams per worker (the paper's six): compute (forward-compute,
//   backward-compute, optimizer, data-wait, checkpoint and any other op without a
//   group), dp (params-sync, grads-sync and any other op with a group), and the
//   four pipeline streams forward-send, forward-recv, backward-send,
//   backward-recv. Ops keep their recorded order on their stream. Names starting
//   "tp-" or "ring-" run inside a compute op here and are reported, not replayed.
// - Dependencies: recv -> compute -> send per micro-batch and direction; the
//   first forward-compute of a step waits for the dp ops (params-sync) that ended
//   before it began; a dp op waits for the last compute op that ended before it began
//   (last backward -> grads-sync, optimizer -> params-sync); a compute op other
//   than forward/backward waits for the last dp op that ended before it began
//   (grads-sync -> optimizer): the paper's tail chain.
// - Groups: ops of one step sharing a group transfer only once every member has
//   started; their duration is the transfer time, end minus the latest start
//   among the members.
// - Ideal duration of an op type, pooled over all steps, workers and stages (the
//   paper: pooling per stage would hide a heavy last stage): the mean duration of
//   a compute type, the median transfer time of a communication type.
// - T and T_ideal: mean over steps of the replay with recorded / ideal
//   durations; S = T / T_ideal, wasted share of GPU time 1 - 1/S.
// - S_t = T(only type t recorded, the rest ideal) / T_ideal; S_dp(d) and S_pp(p)
//   likewise with only DP rank d / PP rank p recorded; a worker's score is
//   min(S_dp, S_pp) (the paper's DP + PP replays instead of DP x PP).
// - M_W = (T - T(the top 3% of workers by score made ideal)) / (T - T_ideal);
//   M_S the same for the last pipeline stage. Zero when T = T_ideal.
// - Sequence-length imbalance: the Pearson correlation between the forward and
//   backward durations of the micro-batches of one worker (a stage of one DP
//   rank), averaged over workers. The paper correlates within a stage; within a
//   worker a slow GPU, which stretches both passes of all its micro-batches
//   alike, does not read as sequence imbalance.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "whatif/simulator.h"
#include "whatif/trace.h"

namespace hdp {

// The stream an op runs on in the dependency model: "compute", "dp",
// "forward-send", "forward-recv", "backward-send", "backward-recv", or "nested"
// (tp- and ring- ops, inside a compute op). An unknown name is a dp collective
// when its ops have groups, else compute.
const char* trace_stream_name(std::string_view op, bool grouped);

enum class StragglerCause { None, SlowWorker, LastStage, SequenceImbalance, Other };
const char* straggler_cause_name(StragglerCause cause);

struct OpTypeReport {
  std::string name;
  bool communication = false;  // ideal = median transfer (else mean duration)
  bool replayed = true;        // false: nested in another op ("tp-", "ring-", "device-")
  int64_t count = 0;
  double mean_us = 0;   // mean duration (transfer time for communication)
  double ideal_us = 0;
  double slowdown = 1;  // S_t
};

struct StragglerReport {
  int64_t steps = 0;
  int pp = 0, dp = 0;        // largest rank + 1
  int64_t operations = 0;    // replayed, all steps
  double measured_step_us = 0;  // mean over steps of (last end - first start) in the trace
  double step_us = 0;           // T: mean replayed step time with recorded durations
  double ideal_step_us = 0;     // T_ideal
  double slowdown = 1;          // S
  double wasted_fraction = 0;   // 1 - 1/S
  double replay_error = 0;      // |T - measured| / measured (the paper keeps jobs under 5%)
  std::vector<OpTypeReport> op_types;
  std::vector<double> dp_slowdown;    // S_dp per DP rank
  std::vector<double> pp_slowdown;    // S_pp per PP rank
  std::vector<double> worker_score;   // [pp_rank * dp + dp_rank]: min(S_dp, S_pp); 0 for absent workers
  struct Worker { int pp_rank = 0, dp_rank = 0; double score = 1; };
  std::vector<Worker> worst_workers;  // the top 3% (at least one) by score, worst first
  double mw = 0;  // M_W
  double ms = 0;  // M_S
  double correlation = 0;         // forward/backward duration correlation (mean over workers)
  int correlated_workers = 0;     // workers with enough micro-batches to correlate
  StragglerCause cause = StragglerCause::None;
  std::string verdict;  // one line naming the likely cause
};

struct StragglerOptions {
  double worst_worker_share = 0.03;    // the paper's top 3%
  double straggling_slowdown = 1.05;   // S below this: no straggler worth naming
  double explained_share = 0.5;        // M_W or M_S above this names the cause
  double correlation_threshold = 0.9;  // the paper's sequence-imbalance signal
  // Called once per step with its graph and ideal replay (seconds), for the ideal
  // timeline; may be empty.
  std::function<void(int64_t step, const sim::OpGraph&, const sim::Replay&)> ideal_step;
};

// Throws TraceError on a trace that cannot be replayed (no operations, or a step
// whose recorded order and groups contradict each other).
StragglerReport analyze_stragglers(const Trace& trace, const StragglerOptions& options = {});

// The report as JSON (docs/tracing.md lists the fields) and as a console table.
std::string straggler_report_json(const StragglerReport& report);
std::string straggler_report_table(const StragglerReport& report);

}  // namespace hdp
