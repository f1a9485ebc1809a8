// How fast the what-if straggler analysis (whatif/straggler_analysis.h) is on a
// big job: a synthetic 1F1B trace (whatif/synthetic_trace.h) of pp x dp workers
// and S steps, one slow worker, analysed in memory (every replay of the method:
// recorded, ideal, one per op type, DP rank and PP rank, the last stage and the
// worst workers), and the JSONL reader's rate on a file of a few of its steps.
//   straggler_bench [--pp 8] [--dp 1250] [--micro-batches 4] [--steps 100] [--parse-steps 2]
// docs/performance.md records the numbers.

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "whatif/straggler_analysis.h"
#include "whatif/synthetic_trace.h"
#include "whatif/trace.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  hdp::SyntheticJob job;
  job.pp = 8;
  job.dp = 1250;
  job.micro_batches = 4;
  job.steps = 100;
  job.noise = 0.02;
  int parse_steps = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int v = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--pp")) job.pp = v;
    else if (!std::strcmp(argv[i], "--dp")) job.dp = v;
    else if (!std::strcmp(argv[i], "--micro-batches")) job.micro_batches = v;
    else if (!std::strcmp(argv[i], "--steps")) job.steps = v;
    else if (!std::strcmp(argv[i], "--parse-steps")) parse_steps = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  job.slow_pp = job.pp / 2;
  job.slow_dp = job.dp / 3;
  job.slow_factor = 1.5;

  auto t0 = std::chrono::steady_clock::now();
  const hdp::Trace trace = hdp::synthesize_trace(job);
  const double generate = seconds_since(t0);
  std::printf("trace: pp %d x dp %d = %d workers, %d micro-batches, %lld steps, %zu operations (generated in %.1f s)\n",
              job.pp, job.dp, job.pp * job.dp, job.micro_batches, static_cast<long long>(job.steps),
              trace.ops.size(), generate);

  t0 = std::chrono::steady_clock::now();
  const std::clock_t cpu0 = std::clock();
  const hdp::StragglerReport report = hdp::analyze_stragglers(trace);
  const double analyse = seconds_since(t0);
  const double analyse_cpu = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  const double replays = static_cast<double>(job.steps) * (2 + 7 + job.dp + job.pp + 1 + 1);
  std::printf("analysis: %.1f s wall, %.1f s CPU (%.2f s per step; about %.0f replays of %.0f operations each, %.1f ns per "
              "operation replayed, CPU)\n",
              analyse, analyse_cpu, analyse / job.steps, replays, static_cast<double>(trace.ops.size()) / job.steps,
              1e9 * analyse_cpu / (replays * static_cast<double>(trace.ops.size()) / job.steps));
  std::printf("S = %.3f, M_W = %.2f, worst worker pp %d dp %d; verdict: %s\n", report.slowdown, report.mw,
              report.worst_workers.front().pp_rank, report.worst_workers.front().dp_rank, report.verdict.c_str());

  // The reader: the first parse_steps steps as one JSONL file.
  const std::string path = (std::filesystem::temp_directory_path() / "straggler_bench.jsonl").string();
  {
    std::ofstream out(path);
    for (const hdp::TraceOp& op : trace.ops) {
      if (op.step >= parse_steps) continue;
      hdp::write_trace_line(out, op.step, op.microbatch, op.pp_rank, op.dp_rank, 0, trace.op_names[op.op],
                            op.start_us, op.end_us, op.group >= 0 ? "g" + std::to_string(op.group) : "");
      out << '\n';
    }
  }
  t0 = std::chrono::steady_clock::now();
  const hdp::Trace read = hdp::read_traces({path});
  const double parse = seconds_since(t0);
  std::printf("reader: %zu lines in %.2f s (%.2f us per line, %.0f MB)\n", read.ops.size(), parse,
              1e6 * parse / static_cast<double>(read.ops.size()),
              static_cast<double>(std::filesystem::file_size(path)) / 1e6);
  std::filesystem::remove(path);
  return 0;
}
