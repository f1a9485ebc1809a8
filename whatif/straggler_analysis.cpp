#include "whatif/straggler_analysis.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <span>
#include <sstream>
#include <unordered_map>

namespace hdp {

const char* straggler_cause_name(StragglerCause cause) {
  switch (cause) {
    case StragglerCause::None: return "none";
    case StragglerCause::SlowWorker: return "slow-worker";
    case StragglerCause::LastStage: return "last-stage-imbalance";
    case StragglerCause::SequenceImbalance: return "sequence-imbalance";
    case StragglerCause::Other: return "other";
  }
  return "other";
}

namespace {

// The paper's six streams per worker, plus ops not replayed.
enum Kind : int { kCompute = 0, kDp, kForwardSend, kForwardRecv, kBackwardSend, kBackwardRecv, kNested, kKinds };
constexpr int kStreams = 6;
const char* const kStreamNames[kStreams] = {"compute", "dp", "forward-send", "forward-recv", "backward-send",
                                            "backward-recv"};

struct TypeInfo {
  Kind kind = kCompute;
  bool forward = false, backward = false;  // forward-compute / backward-compute
};

Kind stream_kind(std::string_view name, bool grouped) {
  namespace n = trace_ops;
  if (name == n::kForwardSend) return kForwardSend;
  if (name == n::kForwardRecv) return kForwardRecv;
  if (name == n::kBackwardSend) return kBackwardSend;
  if (name == n::kBackwardRecv) return kBackwardRecv;
  if (name == n::kParamsSync || name == n::kGradsSync) return kDp;
  if (name.starts_with(n::kTensorParallelPrefix) || name.starts_with(n::kRingPrefix) ||
      name.starts_with(n::kExpertParallelPrefix) || name.starts_with(n::kDevicePrefix))
    return kNested;
  if (name == n::kForwardCompute || name == n::kBackwardCompute || name == n::kOptimizer ||
      name == n::kDataWait || name == n::kCheckpoint)
    return kCompute;
  return grouped ? kDp : kCompute;  // an unknown name: a collective if it has peers
}

std::vector<TypeInfo> classify(const Trace& trace) {
  namespace n = trace_ops;
  std::vector<TypeInfo> types(trace.op_names.size());
  std::vector<char> grouped(types.size(), 0);
  for (const TraceOp& op : trace.ops)
    if (op.group >= 0) grouped[op.op] = 1;
  for (size_t t = 0; t < types.size(); ++t) {
    const std::string& name = trace.op_names[t];
    TypeInfo& info = types[t];
    info.kind = stream_kind(name, grouped[t]);
    info.forward = name == n::kForwardCompute;
    info.backward = name == n::kBackwardCompute;
  }
  return types;
}

}  // namespace

const char* trace_stream_name(std::string_view op, bool grouped) {
  const Kind k = stream_kind(op, grouped);
  return k == kNested ? "nested" : kStreamNames[k];
}

namespace {

bool is_communication(Kind k) { return k != kCompute && k != kNested; }

// One step's ops (indices into the trace), and its graph once built.
struct StepGraph {
  sim::OpGraph graph;
  std::vector<uint32_t> trace_index;  // per graph op
};

struct Context {
  const Trace& trace;
  std::vector<TypeInfo> types;
  int pp = 0, dp = 0;
  std::vector<double> duration_us;  // per trace op: compute duration or transfer time
};

// Durations (transfer times for grouped ops) of one step's ops.
void step_durations(Context& c, std::span<const uint32_t> ops) {
  std::unordered_map<int64_t, double> latest;
  latest.reserve(ops.size());
  for (uint32_t i : ops) {
    const TraceOp& op = c.trace.ops[i];
    if (op.group < 0) continue;
    auto [it, added] = latest.try_emplace(op.group, op.start_us);
    if (!added) it->second = std::max(it->second, op.start_us);
  }
  for (uint32_t i : ops) {
    const TraceOp& op = c.trace.ops[i];
    const double from = op.group < 0 ? op.start_us : latest[op.group];
    // A member that ends before a late peer starts (clock skew across ranks) transfers nothing.
    c.duration_us[i] = std::max(0.0, op.end_us - from);
  }
}

StepGraph build_step_graph(const Context& c, std::vector<uint32_t> ops) {
  const Trace& trace = c.trace;
  // Replayed ops of this step in stream order: by worker, stream, start, end.
  std::erase_if(ops, [&](uint32_t i) { return c.types[trace.ops[i].op].kind == kNested; });
  auto worker_of = [&](const TraceOp& op) { return op.pp_rank * c.dp + op.dp_rank; };
  auto kind_of = [&](const TraceOp& op) { return c.types[op.op].kind; };
  std::sort(ops.begin(), ops.end(), [&](uint32_t a, uint32_t b) {
    const TraceOp &x = trace.ops[a], &y = trace.ops[b];
    const int wx = worker_of(x), wy = worker_of(y);
    if (wx != wy) return wx < wy;
    if (kind_of(x) != kind_of(y)) return kind_of(x) < kind_of(y);
    if (x.start_us != y.start_us) return x.start_us < y.start_us;
    if (x.end_us != y.end_us) return x.end_us < y.end_us;
    return a < b;
  });

  StepGraph s;
  sim::OpGraph& g = s.graph;
  std::vector<uint32_t> labels(trace.op_names.size());
  for (size_t t = 0; t < labels.size(); ++t) labels[t] = g.label(trace.op_names[t]);
  std::unordered_map<int64_t, int> groups;
  // (worker, kind, micro-batch) -> op, for recv -> compute -> send.
  std::unordered_map<uint64_t, sim::OpId> by_microbatch;
  auto key = [](int worker, int kind, int microbatch) {
    return (static_cast<uint64_t>(worker) << 36) | (static_cast<uint64_t>(kind) << 32) |
           static_cast<uint32_t>(microbatch + 1);
  };
  s.trace_index.reserve(ops.size());
  // Per worker: its compute and dp ops in start order (graph ids), for the tail chain.
  std::vector<sim::OpId> compute_ops, dp_ops;
  auto link_worker = [&]() {
    // The last op of `from` that ended no later than `op` began.
    auto last_before = [&](const std::vector<sim::OpId>& from, double start) -> int64_t {
      for (size_t k = from.size(); k-- > 0;)
        if (trace.ops[s.trace_index[from[k]]].end_us <= start) return from[k];
      return -1;
    };
    // The first forward-compute waits for the dp ops that ended before it began
    // (Megatron gathers parameters at the start of a step; our trainer all-reduces
    // the step's token count there).
    for (sim::OpId op : compute_ops) {
      const TraceOp& t = trace.ops[s.trace_index[op]];
      if (!c.types[t.op].forward) continue;
      for (sim::OpId d : dp_ops) {
        const TraceOp& u = trace.ops[s.trace_index[d]];
        if (u.end_us <= t.start_us) g.add_dependency(op, d);
      }
      break;
    }
    // The tail chain: last backward -> dp ops -> optimizer -> dp ops after it.
    for (sim::OpId d : dp_ops) {
      const int64_t before = last_before(compute_ops, trace.ops[s.trace_index[d]].start_us);
      if (before >= 0) g.add_dependency(d, static_cast<sim::OpId>(before));
    }
    for (sim::OpId op : compute_ops) {
      const TraceOp& t = trace.ops[s.trace_index[op]];
      if (c.types[t.op].forward || c.types[t.op].backward) continue;
      const int64_t before = last_before(dp_ops, t.start_us);
      if (before >= 0) g.add_dependency(op, static_cast<sim::OpId>(before));
    }
    compute_ops.clear();
    dp_ops.clear();
  };

  int current_worker = -1;
  int stream_ids[kStreams];
  for (uint32_t i : ops) {
    const TraceOp& op = trace.ops[i];
    const int worker = worker_of(op);
    if (worker != current_worker) {
      if (current_worker >= 0) link_worker();
      current_worker = worker;
      std::fill(std::begin(stream_ids), std::end(stream_ids), -1);
    }
    const Kind kind = kind_of(op);
    if (stream_ids[kind] < 0) stream_ids[kind] = g.add_stream(worker, kStreamNames[kind]);
    int group = -1;
    if (op.group >= 0) {
      auto [it, added] = groups.try_emplace(op.group, 0);
      if (added) it->second = g.new_group();
      group = it->second;
    }
    const sim::OpId id = g.add_op(stream_ids[kind], c.duration_us[i] * 1e-6, labels[op.op], {}, group, op.microbatch);
    s.trace_index.push_back(i);
    if (kind == kCompute) compute_ops.push_back(id);
    if (kind == kDp) dp_ops.push_back(id);
    const TypeInfo& info = c.types[op.op];
    if (op.microbatch >= 0) {
      int slot = -1;  // forward-compute, backward-compute, or a pipeline stream
      if (info.forward) slot = kKinds;
      else if (info.backward) slot = kKinds + 1;
      else if (kind >= kForwardSend && kind <= kBackwardRecv) slot = kind;
      if (slot >= 0) by_microbatch.try_emplace(key(worker, slot, op.microbatch), id);
    }
  }
  if (current_worker >= 0) link_worker();
  // recv -> compute -> send per micro-batch and direction.
  auto find = [&](int worker, int slot, int mb) -> int64_t {
    const auto it = by_microbatch.find(key(worker, slot, mb));
    return it == by_microbatch.end() ? -1 : static_cast<int64_t>(it->second);
  };
  for (const auto& entry : by_microbatch) {
    // Named apart, not a structured binding: the lambda below captures `id`, which
    // C++20 allows but Clang 14 (the fuzzing build, docs/fuzzing.md) does not.
    const auto k = entry.first;
    const auto id = entry.second;
    const int slot = static_cast<int>((k >> 32) & 0xf);
    const int worker = static_cast<int>(k >> 36);
    const int mb = static_cast<int>(static_cast<uint32_t>(k)) - 1;
    auto link = [&](int64_t from) {
      if (from >= 0) g.add_dependency(id, static_cast<sim::OpId>(from));
    };
    if (slot == kKinds) link(find(worker, kForwardRecv, mb));
    if (slot == kKinds + 1) link(find(worker, kBackwardRecv, mb));
    if (slot == kForwardSend) link(find(worker, kKinds, mb));
    if (slot == kBackwardSend) link(find(worker, kKinds + 1, mb));
  }
  return s;
}

// Pearson correlation from running co-moments.
struct Correlation {
  int64_t n = 0;
  double mx = 0, my = 0, sxx = 0, syy = 0, sxy = 0;
  void add(double x, double y) {
    ++n;
    const double dx = x - mx, dy = y - my;
    mx += dx / static_cast<double>(n);
    my += dy / static_cast<double>(n);
    sxx += dx * (x - mx);
    syy += dy * (y - my);
    sxy += dx * (y - my);
  }
  bool defined() const { return n >= 3 && sxx > 0 && syy > 0; }
  double value() const { return sxy / std::sqrt(sxx * syy); }
};

double median(std::vector<float>& v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return 0.5 * (upper + *std::max_element(v.begin(), v.begin() + mid));
}

}  // namespace

StragglerReport analyze_stragglers(const Trace& trace, const StragglerOptions& options) {
  Context c{trace, classify(trace), 0, 0, std::vector<double>(trace.ops.size(), 0.0)};
  // Records of tensor-parallel rank 0, grouped by step.
  std::vector<uint32_t> kept;
  kept.reserve(trace.ops.size());
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    if (op.tp_rank != 0) continue;
    kept.push_back(static_cast<uint32_t>(i));
    c.pp = std::max(c.pp, op.pp_rank + 1);
    c.dp = std::max(c.dp, op.dp_rank + 1);
  }
  if (kept.empty()) throw TraceError("the trace holds no operations (of tensor-parallel rank 0)");
  std::stable_sort(kept.begin(), kept.end(),
                   [&](uint32_t a, uint32_t b) { return trace.ops[a].step < trace.ops[b].step; });
  std::vector<std::span<const uint32_t>> steps;
  for (size_t b = 0; b < kept.size();) {
    size_t e = b;
    while (e < kept.size() && trace.ops[kept[e]].step == trace.ops[kept[b]].step) ++e;
    steps.emplace_back(kept.data() + b, e - b);
    b = e;
  }

  StragglerReport report;
  report.steps = static_cast<int64_t>(steps.size());
  report.pp = c.pp;
  report.dp = c.dp;
  const int workers = c.pp * c.dp;
  const size_t types = trace.op_names.size();

  // Pass 1: durations, the ideal of each op type, the measured step time, and the
  // forward/backward correlation per worker.
  std::vector<double> sum(types, 0.0);
  std::vector<int64_t> count(types, 0);
  std::vector<std::vector<float>> transfers(types);
  std::vector<Correlation> correlation(workers);
  double measured = 0;
  std::unordered_map<uint64_t, std::pair<double, double>> passes;  // (worker, mb) -> (fwd, bwd)
  for (const auto& ops : steps) {
    step_durations(c, ops);
    double first = INFINITY, last = -INFINITY;
    passes.clear();
    for (uint32_t i : ops) {
      const TraceOp& op = trace.ops[i];
      const TypeInfo& info = c.types[op.op];
      if (info.kind != kNested) {  // a device-* record may end after its step's host ops
        first = std::min(first, op.start_us);
        last = std::max(last, op.end_us);
      }
      ++count[op.op];
      sum[op.op] += c.duration_us[i];
      if (is_communication(info.kind)) transfers[op.op].push_back(static_cast<float>(c.duration_us[i]));
      if ((info.forward || info.backward) && op.microbatch >= 0) {
        const uint64_t k = (static_cast<uint64_t>(op.pp_rank * c.dp + op.dp_rank) << 32) |
                           static_cast<uint32_t>(op.microbatch);
        auto& p = passes.try_emplace(k, -1.0, -1.0).first->second;
        (info.forward ? p.first : p.second) += c.duration_us[i] + 1.0;  // -1 + 1 + d: the pass's duration
      }
    }
    measured += last - first;
    for (const auto& [k, p] : passes)
      if (p.first >= 0 && p.second >= 0) correlation[k >> 32].add(p.first, p.second);
  }
  std::vector<double> ideal_us(types, 0.0);
  for (size_t t = 0; t < types; ++t) {
    OpTypeReport r;
    r.name = trace.op_names[t];
    r.communication = is_communication(c.types[t].kind);
    r.replayed = c.types[t].kind != kNested;
    r.count = count[t];
    if (count[t] == 0) continue;  // only on other tensor-parallel ranks
    r.mean_us = sum[t] / static_cast<double>(count[t]);
    // Compute: the mean; communication: the median transfer (the paper's choice,
    // robust to the few transfers that absorbed a peer's lateness).
    r.ideal_us = r.communication ? median(transfers[t]) : r.mean_us;
    ideal_us[t] = r.ideal_us;
    transfers[t] = {};
    report.op_types.push_back(r);
  }
  report.measured_step_us = measured / static_cast<double>(steps.size());
  double corr_sum = 0;
  for (const Correlation& k : correlation) {
    if (!k.defined()) continue;
    corr_sum += k.value();
    ++report.correlated_workers;
  }
  report.correlation = report.correlated_workers ? corr_sum / report.correlated_workers : 0.0;

  // Pass 2: replays per step. Scenario sums over steps, in microseconds.
  double t_real = 0, t_ideal = 0, t_last_fixed = 0;
  std::vector<double> t_type(types, 0.0), t_dp(c.dp, 0.0), t_pp(c.pp, 0.0);
  std::vector<double> real, ideal, mixed, start, end;
  std::vector<char> worker_present(workers, 0);
  for (const auto& ops : steps) {
    step_durations(c, ops);
    StepGraph s = build_step_graph(c, std::vector<uint32_t>(ops.begin(), ops.end()));
    const size_t n = s.graph.size();
    report.operations += static_cast<int64_t>(n);
    std::unique_ptr<sim::ReplayPlan> plan;
    try {
      plan = std::make_unique<sim::ReplayPlan>(s.graph);
    } catch (const sim::SimulationError& e) {
      throw TraceError("trace step " + std::to_string(trace.ops[ops[0]].step) +
                       ": the recorded order and groups cannot be replayed: " + e.what());
    }
    // Everything by position in the plan's run order (ReplayPlan::sweep_in_order).
    const std::vector<sim::OpId>& order = plan->order();
    real.resize(n);
    ideal.resize(n);
    std::vector<uint32_t> type_of(n);
    // Positions of each DP rank's and PP rank's ops, for their scenarios.
    std::vector<std::vector<uint32_t>> of_dp(c.dp), of_pp(c.pp), of_type(types);
    for (size_t p = 0; p < n; ++p) {
      const uint32_t i = s.trace_index[order[p]];
      const TraceOp& op = trace.ops[i];
      real[p] = c.duration_us[i] * 1e-6;
      ideal[p] = ideal_us[op.op] * 1e-6;
      of_dp[op.dp_rank].push_back(static_cast<uint32_t>(p));
      of_pp[op.pp_rank].push_back(static_cast<uint32_t>(p));
      of_type[op.op].push_back(static_cast<uint32_t>(p));
      worker_present[op.pp_rank * c.dp + op.dp_rank] = 1;
    }
    // A scenario: `base` durations except at `positions`, which take `other`'s.
    // `mixed` holds `base` between scenarios: only the positions are patched and
    // restored, not the whole step copied (a DP rank is 1/dp of the step).
    mixed = ideal;
    auto scenario = [&](const std::vector<double>& base, const std::vector<double>& other,
                        const std::vector<uint32_t>& positions) {
      if (&base != &ideal) mixed = base;
      for (uint32_t p : positions) mixed[p] = other[p];
      const double t = plan->sweep_in_order(mixed, start, end) * 1e6;
      for (uint32_t p : positions) mixed[p] = base[p];
      if (&base != &ideal) mixed = ideal;
      return t;
    };
    t_real += plan->sweep_in_order(real, start, end) * 1e6;
    t_ideal += plan->sweep_in_order(ideal, start, end) * 1e6;
    if (options.ideal_step) {
      sim::Replay r;
      for (size_t p = 0; p < n; ++p) s.graph.set_duration(order[p], ideal[p]);
      r.makespan = plan->sweep(s.graph.durations(), r.start, r.end);
      options.ideal_step(trace.ops[ops[0]].step, s.graph, r);
    }
    for (size_t t = 0; t < types; ++t)
      if (count[t] > 0 && c.types[t].kind != kNested) t_type[t] += scenario(ideal, real, of_type[t]);
    for (int d = 0; d < c.dp; ++d) t_dp[d] += scenario(ideal, real, of_dp[d]);
    for (int p = 0; p < c.pp; ++p) t_pp[p] += scenario(ideal, real, of_pp[p]);
    t_last_fixed += scenario(real, ideal, of_pp[c.pp - 1]);
  }
  const double nsteps = static_cast<double>(steps.size());
  report.step_us = t_real / nsteps;
  report.ideal_step_us = t_ideal / nsteps;
  report.slowdown = t_ideal > 0 ? t_real / t_ideal : 1.0;
  report.wasted_fraction = 1.0 - 1.0 / report.slowdown;
  report.replay_error =
      report.measured_step_us > 0 ? std::abs(report.step_us - report.measured_step_us) / report.measured_step_us : 0;
  for (OpTypeReport& r : report.op_types) {
    const size_t t = std::find(trace.op_names.begin(), trace.op_names.end(), r.name) - trace.op_names.begin();
    r.slowdown = r.replayed && t_ideal > 0 ? t_type[t] / t_ideal : 1.0;
  }
  for (int d = 0; d < c.dp; ++d) report.dp_slowdown.push_back(t_ideal > 0 ? t_dp[d] / t_ideal : 1.0);
  for (int p = 0; p < c.pp; ++p) report.pp_slowdown.push_back(t_ideal > 0 ? t_pp[p] / t_ideal : 1.0);
  report.worker_score.assign(workers, 0.0);
  std::vector<StragglerReport::Worker> ranked;
  for (int p = 0; p < c.pp; ++p) {
    for (int d = 0; d < c.dp; ++d) {
      if (!worker_present[p * c.dp + d]) continue;
      const double score = std::min(report.dp_slowdown[d], report.pp_slowdown[p]);
      report.worker_score[p * c.dp + d] = score;
      ranked.push_back({p, d, score});
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.score > b.score; });
  const size_t worst = std::max<size_t>(
      1, static_cast<size_t>(std::ceil(options.worst_worker_share * static_cast<double>(ranked.size()) - 1e-9)));
  ranked.resize(std::min(worst, ranked.size()));
  report.worst_workers = ranked;

  // Pass 3: T with the worst workers made ideal.
  std::vector<char> fixed(workers, 0);
  for (const auto& w : ranked) fixed[w.pp_rank * c.dp + w.dp_rank] = 1;
  double t_workers_fixed = 0;
  for (const auto& ops : steps) {
    step_durations(c, ops);
    StepGraph s = build_step_graph(c, std::vector<uint32_t>(ops.begin(), ops.end()));
    const sim::ReplayPlan plan(s.graph);
    mixed.resize(s.graph.size());
    for (size_t k = 0; k < mixed.size(); ++k) {
      const TraceOp& op = trace.ops[s.trace_index[k]];
      mixed[k] = (fixed[op.pp_rank * c.dp + op.dp_rank] ? ideal_us[op.op] : c.duration_us[s.trace_index[k]]) * 1e-6;
    }
    t_workers_fixed += plan.sweep(mixed, start, end) * 1e6;
  }
  // explain(G) = (T - T with G ideal) / (T - T_ideal); nothing to explain when T = T_ideal.
  const double excess = t_real - t_ideal;
  const bool straggling = excess > 1e-9 * t_real;
  report.mw = straggling ? (t_real - t_workers_fixed) / excess : 0.0;
  report.ms = straggling ? (t_real - t_last_fixed) / excess : 0.0;

  // The verdict: a few workers first (the most specific pattern), then
  // correlated passes (sequence imbalance), then the last stage.
  char line[512];
  const double lost = 100.0 * report.wasted_fraction;
  if (report.slowdown < options.straggling_slowdown) {
    report.cause = StragglerCause::None;
    std::snprintf(line, sizeof line, "none: the job runs within %.1f%% of its ideal step time (S = %.3f)",
                  100.0 * (report.slowdown - 1.0), report.slowdown);
  } else if (report.mw > options.explained_share) {
    report.cause = StragglerCause::SlowWorker;
    const auto& w = report.worst_workers.front();
    std::snprintf(line, sizeof line,
                  "slow worker: pp %d dp %d (score %.2f) and the worst %zu worker(s) explain %.0f%% of the %.1f%% "
                  "lost (S = %.3f)",
                  w.pp_rank, w.dp_rank, w.score, report.worst_workers.size(), 100.0 * report.mw, lost,
                  report.slowdown);
  } else if (report.correlated_workers > 0 && report.correlation >= options.correlation_threshold) {
    report.cause = StragglerCause::SequenceImbalance;
    std::snprintf(line, sizeof line,
                  "sequence-length imbalance: forward and backward durations correlate at %.2f across "
                  "micro-batches; %.1f%% lost (S = %.3f); balance the per-micro-batch attention work",
                  report.correlation, lost, report.slowdown);
  } else if (report.ms > options.explained_share) {
    report.cause = StragglerCause::LastStage;
    std::snprintf(line, sizeof line,
                  "last-stage imbalance: the last pipeline stage explains %.0f%% of the %.1f%% lost (S = %.3f); "
                  "give it fewer layers",
                  100.0 * report.ms, lost, report.slowdown);
  } else {
    report.cause = StragglerCause::Other;
    const OpTypeReport* top = nullptr;
    for (const OpTypeReport& r : report.op_types)
      if (r.replayed && (!top || r.slowdown > top->slowdown)) top = &r;
    std::snprintf(line, sizeof line, "other: no few workers or stage explain it; %s slows the job most (S_t = %.3f); "
                  "%.1f%% lost (S = %.3f)", top ? top->name.c_str() : "?", top ? top->slowdown : 1.0, lost,
                  report.slowdown);
  }
  report.verdict = line;
  return report;
}

std::string straggler_report_json(const StragglerReport& r) {
  nlohmann::ordered_json j;
  j["steps"] = r.steps;
  j["pp"] = r.pp;
  j["dp"] = r.dp;
  j["operations"] = r.operations;
  j["measured_step_us"] = r.measured_step_us;
  j["step_us"] = r.step_us;
  j["ideal_step_us"] = r.ideal_step_us;
  j["slowdown"] = r.slowdown;
  j["wasted_fraction"] = r.wasted_fraction;
  j["replay_error"] = r.replay_error;
  j["cause"] = straggler_cause_name(r.cause);
  j["verdict"] = r.verdict;
  j["mw"] = r.mw;
  j["ms"] = r.ms;
  j["correlation"] = r.correlation;
  j["correlated_workers"] = r.correlated_workers;
  nlohmann::ordered_json types = nlohmann::ordered_json::array();
  for (const OpTypeReport& t : r.op_types) {
    types.push_back({{"op", t.name}, {"communication", t.communication}, {"replayed", t.replayed},
                     {"count", t.count}, {"mean_us", t.mean_us}, {"ideal_us", t.ideal_us},
                     {"slowdown", t.slowdown}});
  }
  j["op_types"] = types;
  j["dp_slowdown"] = r.dp_slowdown;
  j["pp_slowdown"] = r.pp_slowdown;
  nlohmann::ordered_json heat = nlohmann::ordered_json::array();
  for (int p = 0; p < r.pp; ++p)
    heat.push_back(std::vector<double>(r.worker_score.begin() + p * r.dp, r.worker_score.begin() + (p + 1) * r.dp));
  j["worker_score"] = heat;
  nlohmann::ordered_json worst = nlohmann::ordered_json::array();
  for (const auto& w : r.worst_workers) worst.push_back({{"pp_rank", w.pp_rank}, {"dp_rank", w.dp_rank}, {"score", w.score}});
  j["worst_workers"] = worst;
  return j.dump(2) + "\n";
}

std::string straggler_report_table(const StragglerReport& r) {
  std::ostringstream out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "trace: %lld steps, pp %d x dp %d workers, %lld operations replayed\n",
                static_cast<long long>(r.steps), r.pp, r.dp, static_cast<long long>(r.operations));
  out << buf;
  std::snprintf(buf, sizeof buf,
                "step time: measured %.1f us, replayed %.1f us (error %.1f%%), ideal %.1f us\n"
                "slowdown S = %.3f (%.1f%% of GPU time lost), M_W = %.2f, M_S = %.2f, fwd/bwd correlation %.2f\n\n",
                r.measured_step_us, r.step_us, 100.0 * r.replay_error, r.ideal_step_us, r.slowdown,
                100.0 * r.wasted_fraction, r.mw, r.ms, r.correlation);
  out << buf;
  std::snprintf(buf, sizeof buf, "%-22s %-8s %10s %12s %12s %8s\n", "op type", "kind", "count", "mean us", "ideal us",
                "S_t");
  out << buf;
  for (const OpTypeReport& t : r.op_types) {
    std::snprintf(buf, sizeof buf, "%-22s %-8s %10lld %12.1f %12.1f %8s\n", t.name.c_str(),
                  !t.replayed ? "nested" : t.communication ? "comm" : "compute", static_cast<long long>(t.count),
                  t.mean_us, t.ideal_us, t.replayed ? (std::to_string(t.slowdown).substr(0, 5)).c_str() : "-");
    out << buf;
  }
  out << "\nworst workers (min(S_dp, S_pp)):";
  for (const auto& w : r.worst_workers) {
    std::snprintf(buf, sizeof buf, " pp %d dp %d: %.3f;", w.pp_rank, w.dp_rank, w.score);
    out << buf;
  }
  out << "\nverdict: " << r.verdict << "\n";
  return out.str();
}

}  // namespace hdp
