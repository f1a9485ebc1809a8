// `trainer analyze`: the what-if straggler analysis of op traces
// (whatif/straggler_analysis.h) with its report, heatmap and ideal timeline;
// `trainer trace merge`: a run's per-rank trace files as one Perfetto trace.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spec/parallel_degrees.h"
#include "whatif/simulator.h"
#include "whatif/straggler_analysis.h"
#include "whatif/trace.h"
#include "trainer/command_line.h"
#include "trainer/commands.h"
#include "trainer/svg.h"

namespace hdp {
namespace {

const char* const kAnalyzeHelp = R"(usage: trainer analyze TRACE... [--output REPORT.json] [--heatmap HEATMAP.svg]
                       [--timeline IDEAL.json]

What-if straggler analysis (Lin et al., OSDI 2025) of op traces in the JSONL
format of docs/tracing.md: a run's trace directory (RUN_DIR/trace), trace files,
or files written by another trainer. Replays every step with recorded and with
ideal durations and prints how much faster the job would be without
stragglers (S, the share of GPU time lost), the slowdown per op type (S_t), per
DP and PP rank, the worst workers, M_W, M_S, the forward/backward correlation,
and a verdict naming the likely cause.
  --output PATH     the report as JSON
  --heatmap PATH    the workers' slowdown min(S_dp, S_pp) as SVG (x: DP rank, y: PP rank)
  --timeline PATH   the ideal replay as Chrome/Perfetto trace JSON, steps one after another

Exit code 2 on a trace that cannot be read (the message names file and line).
)";

const char* const kTraceHelp = R"(usage: trainer trace merge TRACE_DIR... --output TRACE.json

Merges a run's per-rank trace files (the trace section writes RUN_DIR/trace/rank-*.jsonl)
into one Chrome/Perfetto trace JSON: one process per rank (pp, hdp, tp) and one
track per stream (compute, dp, forward/backward send/recv, nested collectives).
)";

void create_parent(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
}

void write_heatmap(const StragglerReport& r, const std::string& path) {
  const double cell = std::clamp(800.0 / std::max(r.dp, 1), 1.0, 48.0);
  const double row = std::clamp(400.0 / std::max(r.pp, 1), 8.0, 48.0);
  const double left = 70, top = 50, legend = 60;
  const double width = left + cell * r.dp + 30, height = top + row * r.pp + 50 + legend;
  Svg svg(std::max(width, 420.0), height);
  svg.text(left, 20, "worker slowdown min(S_dp, S_pp); S = " + std::to_string(r.slowdown).substr(0, 5), 14);
  double worst = 1.0;
  for (double s : r.worker_score) worst = std::max(worst, s);
  const double span = std::max(worst - 1.0, 1e-3);
  for (int p = 0; p < r.pp; ++p) {
    for (int d = 0; d < r.dp; ++d) {
      const double s = r.worker_score[p * r.dp + d];
      char title[96];
      std::snprintf(title, sizeof title, "pp %d dp %d: %.3f", p, d, s);
      svg.rect(left + d * cell, top + p * row, cell, row, s > 0 ? heat_colour((s - 1.0) / span) : "#dddddd", title,
               cell >= 6 ? "#888888" : "");
      if (cell >= 36 && row >= 20 && s > 0) {
        char value[16];
        std::snprintf(value, sizeof value, "%.2f", s);
        svg.text(left + d * cell + cell / 2, top + p * row + row / 2 + 4, value, 10, "middle");
      }
    }
    svg.text(left - 6, top + p * row + row / 2 + 4, "pp " + std::to_string(p), 11, "end");
  }
  const int label_every = std::max(1, static_cast<int>(std::ceil(30.0 / cell)));
  for (int d = 0; d < r.dp; d += label_every)
    svg.text(left + d * cell + cell / 2, top + r.pp * row + 14, std::to_string(d), 10, "middle");
  svg.text(left + cell * r.dp / 2, top + r.pp * row + 30, "DP rank", 12, "middle");
  // The legend: 1.0 (white) to the worst score (red).
  const double ly = top + r.pp * row + 44;
  for (int k = 0; k < 100; ++k) svg.rect(left + 2.0 * k, ly, 2.0, 12, heat_colour(k / 99.0));
  svg.text(left, ly + 26, "1.00", 10, "middle");
  svg.text(left + 200, ly + 26, std::to_string(worst).substr(0, 5), 10, "middle");
  svg.save(path);
}

int analyze(Arguments& args) {
  const std::optional<std::string> output = args.option("--output");
  const std::optional<std::string> heatmap = args.option("--heatmap");
  const std::optional<std::string> timeline = args.option("--timeline");
  const std::vector<std::string> traces = args.positional();
  args.expect_empty();
  if (traces.empty()) throw UsageError("expects at least one TRACE (a file or a run's trace directory)");
  const Trace trace = read_traces(traces);

  StragglerOptions options;
  std::ofstream timeline_file;
  std::unique_ptr<sim::ChromeTraceWriter> writer;
  std::vector<std::string> process_names;
  double offset = 0;
  if (timeline) {
    create_parent(*timeline);
    timeline_file.open(*timeline);
    if (!timeline_file) throw InputError(*timeline + ": cannot write the timeline");
    writer = std::make_unique<sim::ChromeTraceWriter>(timeline_file);
    int pp = 0, dp = 0;
    for (const TraceOp& op : trace.ops) {
      pp = std::max(pp, op.pp_rank + 1);
      dp = std::max(dp, op.dp_rank + 1);
    }
    for (int p = 0; p < pp; ++p)
      for (int d = 0; d < dp; ++d) process_names.push_back("pp " + std::to_string(p) + " dp " + std::to_string(d));
    options.ideal_step = [&](int64_t, const sim::OpGraph& graph, const sim::Replay& replay) {
      writer->add(graph, replay, offset, process_names);
      offset += replay.makespan;
    };
  }
  const StragglerReport report = analyze_stragglers(trace, options);
  if (writer) writer->finish();
  std::fputs(straggler_report_table(report).c_str(), stdout);
  if (output) {
    create_parent(*output);
    std::ofstream out(*output);
    out << straggler_report_json(report);
    if (!out) throw InputError(*output + ": cannot write the report");
  }
  if (heatmap) {
    create_parent(*heatmap);
    write_heatmap(report, *heatmap);
  }
  return kExitSuccess;
}

// One process per rank (pid = the trainer's rank of pp, hdp (the format's dp_rank)
// and tp, ParallelDegrees::rank), one track per stream, through the one Chrome trace
// writer (whatif/simulator.h).
int merge(Arguments& args) {
  const std::string output = args.required("--output");
  const std::vector<std::string> dirs = args.positional();
  args.expect_empty();
  if (dirs.empty()) throw UsageError("trace merge expects a trace directory or files");
  const Trace trace = read_traces(dirs);
  ParallelDegrees grid{0, 0, 0};
  double origin = INFINITY;
  std::vector<char> grouped(trace.op_names.size(), 0);
  for (const TraceOp& op : trace.ops) {
    grid.pp = std::max(grid.pp, op.pp_rank + 1);
    grid.hdp = std::max(grid.hdp, op.dp_rank + 1);
    grid.tp = std::max(grid.tp, op.tp_rank + 1);
    origin = std::min(origin, op.start_us);
    if (op.group >= 0) grouped[op.op] = 1;
  }
  sim::OpGraph graph;
  std::vector<uint32_t> labels;
  for (const std::string& name : trace.op_names) labels.push_back(graph.label(name));
  std::vector<std::string> names(static_cast<size_t>(grid.world()));
  std::map<std::pair<int, std::string>, int> streams;
  sim::Replay replay;
  for (const TraceOp& op : trace.ops) {
    const int rank = grid.rank(GridCoords{op.tp_rank, op.pp_rank, op.dp_rank});
    names[rank] = "rank " + std::to_string(rank) + " (pp " + std::to_string(op.pp_rank) + " hdp " +
                  std::to_string(op.dp_rank) + " tp " + std::to_string(op.tp_rank) + ")";
    const std::string stream = trace_stream_name(trace.op_names[op.op], grouped[op.op]);
    auto [it, added] = streams.try_emplace({rank, stream}, 0);
    if (added) it->second = graph.add_stream(rank, stream);
    graph.add_op(it->second, (op.end_us - op.start_us) * 1e-6, labels[op.op], {}, -1, op.microbatch);
    replay.start.push_back((op.start_us - origin) * 1e-6);
    replay.end.push_back((op.end_us - origin) * 1e-6);
  }
  create_parent(output);
  std::ofstream out(output);
  sim::write_chrome_trace(out, graph, replay, names);
  if (!out) throw InputError(output + ": cannot write the merged trace");
  std::printf("trace merge: %zu operations of %d ranks -> %s\n", trace.ops.size(), grid.world(), output.c_str());
  return kExitSuccess;
}

}  // namespace

int command_analyze(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kAnalyzeHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("analyze", [&] { return analyze(args); });
}

int command_trace(const std::vector<std::string>& raw) {
  Arguments args(raw);
  if (args.wants_help() || raw.empty()) {
    std::fputs(kTraceHelp, raw.empty() ? stderr : stdout);
    return raw.empty() ? kExitBadInput : kExitSuccess;
  }
  return run_subcommand("trace", [&] {
    const std::vector<std::string> positional(raw.begin(), raw.end());
    if (positional[0] != "merge") throw UsageError("unknown trace command '" + positional[0] + "'; choose merge");
    Arguments rest(std::vector<std::string>(raw.begin() + 1, raw.end()));
    return merge(rest);
  });
}

}  // namespace hdp
