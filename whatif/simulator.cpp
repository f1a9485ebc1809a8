#include "whatif/simulator.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>

namespace hdp::sim {

int OpGraph::add_stream(int process, std::string name) {
  if (process < 0) throw std::invalid_argument("OpGraph::add_stream: negative process " + std::to_string(process));
  if (static_cast<size_t>(process) >= streams_per_process_.size()) streams_per_process_.resize(process + 1, 0);
  Stream s;
  s.process = process;
  s.name = std::move(name);
  s.index = streams_per_process_[process]++;
  streams_.push_back(std::move(s));
  return static_cast<int>(streams_.size()) - 1;
}

uint32_t OpGraph::label(const std::string& name) {
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] == name) return static_cast<uint32_t>(i);
  labels_.push_back(name);
  return static_cast<uint32_t>(labels_.size() - 1);
}

int OpGraph::new_group() {
  group_size_.push_back(0);
  return static_cast<int>(group_size_.size()) - 1;
}

OpId OpGraph::add_op(int stream, double duration, uint32_t label, std::span<const OpId> deps, int group,
                     int64_t tag) {
  if (stream < 0 || static_cast<size_t>(stream) >= streams_.size())
    throw std::invalid_argument("OpGraph::add_op: no stream " + std::to_string(stream));
  if (label >= labels_.size() && !(labels_.empty() && label == 0))
    throw std::invalid_argument("OpGraph::add_op: no label " + std::to_string(label));
  if (group >= static_cast<int>(group_size_.size()) || group < -1)
    throw std::invalid_argument("OpGraph::add_op: no group " + std::to_string(group));
  if (stream_.size() >= UINT32_MAX) throw std::length_error("OpGraph: too many operations");
  const OpId id = static_cast<OpId>(stream_.size());
  stream_.push_back(stream);
  duration_.push_back(duration);
  label_.push_back(label);
  group_.push_back(group);
  tag_.push_back(tag);
  if (group >= 0) ++group_size_[group];
  for (OpId d : deps) edges_.emplace_back(d, id);
  return id;
}

void OpGraph::add_dependency(OpId op, OpId depends_on) { edges_.emplace_back(depends_on, op); }

std::string OpGraph::describe(OpId op) const {
  if (op >= size()) return "operation " + std::to_string(op) + " (not in the graph)";
  const Stream& s = streams_[stream_[op]];
  std::string text = "process " + std::to_string(s.process) + " " + s.name + ": " +
                     (labels_.empty() ? std::string("op") : labels_[label_[op]]);
  if (tag_[op] >= 0) text += " (tag " + std::to_string(tag_[op]) + ")";
  return text;
}

ReplayPlan::ReplayPlan(const OpGraph& graph) {
  const size_t n = graph.size();
  // Successors in CSR form: explicit dependencies plus the next operation of each stream.
  std::vector<uint32_t> indegree(n, 0), offsets(n + 1, 0);
  std::vector<int64_t> last_of_stream(graph.streams().size(), -1);
  std::vector<int64_t> stream_next(n, -1), stream_prev(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const int s = graph.stream(static_cast<OpId>(i));
    if (last_of_stream[s] >= 0) {
      stream_next[last_of_stream[s]] = static_cast<int64_t>(i);
      stream_prev[i] = last_of_stream[s];
      ++indegree[i];
    }
    last_of_stream[s] = static_cast<int64_t>(i);
  }
  std::vector<uint32_t> op_pred_offsets(n + 1, 0);
  for (const auto& [from, to] : graph.edges()) {
    if (from >= n || to >= n) {
      throw SimulationError("replay: a dependency between operations " + std::to_string(from) + " and " +
                            std::to_string(to) + ", but the graph has " + std::to_string(n));
    }
    ++offsets[from + 1];
    ++indegree[to];
    ++op_pred_offsets[to + 1];
  }
  for (size_t i = 0; i < n; ++i) {
    if (stream_prev[i] >= 0) ++op_pred_offsets[i + 1];
    offsets[i + 1] += offsets[i];
    op_pred_offsets[i + 1] += op_pred_offsets[i];
  }
  std::vector<OpId> successors(graph.edges().size());
  std::vector<OpId> op_preds(op_pred_offsets.back());
  {
    std::vector<uint32_t> fill(offsets.begin(), offsets.end() - 1);
    std::vector<uint32_t> pfill(op_pred_offsets.begin(), op_pred_offsets.end() - 1);
    for (size_t i = 0; i < n; ++i)
      if (stream_prev[i] >= 0) op_preds[pfill[i]++] = static_cast<OpId>(stream_prev[i]);
    for (const auto& [from, to] : graph.edges()) {
      successors[fill[from]++] = to;
      op_preds[pfill[to]++] = from;
    }
  }
  // Group members, for releasing a group at once.
  const size_t groups = graph.num_groups();
  std::vector<uint32_t> group_offsets(groups + 1, 0);
  for (size_t i = 0; i < n; ++i)
    if (graph.group(static_cast<OpId>(i)) >= 0) ++group_offsets[graph.group(static_cast<OpId>(i)) + 1];
  for (size_t g = 0; g < groups; ++g) group_offsets[g + 1] += group_offsets[g];
  std::vector<OpId> members(group_offsets.back());
  {
    std::vector<uint32_t> fill(group_offsets.begin(), group_offsets.end() - 1);
    for (size_t i = 0; i < n; ++i)
      if (graph.group(static_cast<OpId>(i)) >= 0) members[fill[graph.group(static_cast<OpId>(i))]++] = static_cast<OpId>(i);
  }
  std::vector<uint32_t> arrived(groups, 0);

  order_.reserve(n);
  event_offsets_.reserve(n + 1);
  event_offsets_.push_back(0);
  std::vector<OpId> stack;
  stack.reserve(1024);
  for (size_t i = 0; i < n; ++i)
    if (indegree[i] == 0) stack.push_back(static_cast<OpId>(i));
  auto release = [&](OpId op) {
    order_.push_back(op);
    auto visit = [&](size_t next) {
      if (--indegree[next] == 0) stack.push_back(static_cast<OpId>(next));
    };
    if (stream_next[op] >= 0) visit(static_cast<size_t>(stream_next[op]));
    for (uint32_t k = offsets[op]; k < offsets[op + 1]; ++k) visit(successors[k]);
  };
  while (!stack.empty()) {
    const OpId op = stack.back();
    stack.pop_back();
    const int g = graph.group(op);
    if (g < 0) {
      release(op);
      grouped_.push_back(0);
      event_offsets_.push_back(static_cast<uint32_t>(order_.size()));
      continue;
    }
    if (++arrived[g] < group_offsets[g + 1] - group_offsets[g]) continue;
    for (uint32_t k = group_offsets[g]; k < group_offsets[g + 1]; ++k) release(members[k]);
    grouped_.push_back(1);
    event_offsets_.push_back(static_cast<uint32_t>(order_.size()));
  }

  if (order_.size() < n) {
    // Name a few operations that never became ready or wait for absent peers.
    std::string stuck;
    int shown = 0;
    for (size_t i = 0; i < n && shown < 4; ++i) {
      const int g = graph.group(static_cast<OpId>(i));
      const bool waiting_for_peers = indegree[i] == 0 && g >= 0;
      if (waiting_for_peers) {
        stuck += (shown ? "; " : "") + graph.describe(static_cast<OpId>(i)) + " waits for its group's other members";
        ++shown;
      }
    }
    for (size_t i = 0; i < n && shown < 4; ++i) {
      if (indegree[i] > 0) {
        stuck += (shown ? "; " : "") + graph.describe(static_cast<OpId>(i)) + " never becomes ready";
        ++shown;
      }
    }
    throw SimulationError("replay: deadlock or cycle, " + std::to_string(n - order_.size()) + " of " +
                          std::to_string(n) + " operations cannot run: " + stuck);
  }
  // Predecessors by position.
  std::vector<uint32_t> position(n);
  for (size_t i = 0; i < n; ++i) position[order_[i]] = static_cast<uint32_t>(i);
  pred_offsets_.assign(n + 1, 0);
  preds_.reserve(op_preds.size());
  for (size_t i = 0; i < n; ++i) {
    const OpId op = order_[i];
    for (uint32_t k = op_pred_offsets[op]; k < op_pred_offsets[op + 1]; ++k) preds_.push_back(position[op_preds[k]]);
    pred_offsets_[i + 1] = static_cast<uint32_t>(preds_.size());
  }
}

double ReplayPlan::sweep_in_order(std::span<const double> dur, std::vector<double>& start,
                                  std::vector<double>& end) const {
  const size_t n = size();
  start.resize(n);
  end.resize(n);
  double makespan = 0;
  auto ready = [&](uint32_t p) {
    double t = 0;
    for (uint32_t k = pred_offsets_[p]; k < pred_offsets_[p + 1]; ++k) t = std::max(t, end[preds_[k]]);
    start[p] = t;
    return t;
  };
  const size_t events = grouped_.size();
  for (size_t e = 0; e < events; ++e) {
    const uint32_t first = event_offsets_[e], last = event_offsets_[e + 1];
    if (!grouped_[e]) {
      end[first] = ready(first) + dur[first];
      makespan = std::max(makespan, end[first]);
      continue;
    }
    double latest = 0;
    for (uint32_t p = first; p < last; ++p) latest = std::max(latest, ready(p));
    for (uint32_t p = first; p < last; ++p) {
      end[p] = latest + dur[p];
      makespan = std::max(makespan, end[p]);
    }
  }
  return makespan;
}

double ReplayPlan::sweep(std::span<const double> dur, std::vector<double>& start, std::vector<double>& end) const {
  const size_t n = size();
  std::vector<double> ordered(n), s, e;
  for (size_t p = 0; p < n; ++p) ordered[p] = dur[order_[p]];
  const double makespan = sweep_in_order(ordered, s, e);
  start.resize(n);
  end.resize(n);
  for (size_t p = 0; p < n; ++p) {
    start[order_[p]] = s[p];
    end[order_[p]] = e[p];
  }
  return makespan;
}

Replay replay(const OpGraph& graph, std::span<const double> durations) {
  const size_t n = graph.size();
  if (!durations.empty() && durations.size() != n) {
    throw SimulationError("replay: " + std::to_string(durations.size()) + " durations for " + std::to_string(n) +
                          " operations");
  }
  const std::span<const double> dur = durations.empty() ? std::span<const double>(graph.durations()) : durations;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(dur[i]) || dur[i] < 0) {
      throw SimulationError("replay: " + graph.describe(static_cast<OpId>(i)) + " has duration " +
                            std::to_string(dur[i]));
    }
  }
  const ReplayPlan plan(graph);
  Replay r;
  r.makespan = plan.sweep(dur, r.start, r.end);
  r.stream_occupied.assign(graph.streams().size(), 0.0);
  r.stream_busy.assign(graph.streams().size(), 0.0);
  for (size_t i = 0; i < n; ++i) {
    r.stream_occupied[graph.stream(static_cast<OpId>(i))] += r.end[i] - r.start[i];
    r.stream_busy[graph.stream(static_cast<OpId>(i))] += dur[i];
  }
  return r;
}

ChromeTraceWriter::ChromeTraceWriter(std::ostream& out) : out_(out), json_(out) {
  json_.begin_object();
  json_.key("displayTimeUnit").string("ms");
  json_.key("traceEvents").begin_array(JsonWriter::Lines::OnePerLine);
}

void ChromeTraceWriter::finish() {
  if (finished_) return;
  finished_ = true;
  json_.end_array().end_object();
  out_ << '\n';
}

void ChromeTraceWriter::add(const OpGraph& graph, const Replay& replay, double offset,
                            const std::vector<std::string>& process_names) {
  // A metadata event naming a process (tid 0) or a thread.
  auto name_event = [&](const char* what, int pid, int tid, const std::string& name) {
    json_.begin_object();
    json_.key("name").string(what).key("ph").string("M").key("pid").integer(pid).key("tid").integer(tid);
    json_.key("args").begin_object().key("name").string(name).end_object();
    json_.end_object();
  };
  for (const Stream& s : graph.streams()) {
    if (static_cast<size_t>(s.process) >= named_.size()) named_.resize(s.process + 1);
    std::vector<bool>& named = named_[s.process];
    if (named.size() < static_cast<size_t>(s.index) + 2) named.resize(s.index + 2, false);
    if (!named[0] && static_cast<size_t>(s.process) < process_names.size() && !process_names[s.process].empty()) {
      named[0] = true;
      name_event("process_name", s.process, 0, process_names[s.process]);
    }
    if (named[s.index + 1]) continue;
    named[s.index + 1] = true;
    name_event("thread_name", s.process, s.index, s.name);
  }
  // Times in microseconds to the nanosecond, transfer times in milliseconds.
  for (size_t i = 0; i < graph.size(); ++i) {
    const OpId op = static_cast<OpId>(i);
    const double extent = replay.end[i] - replay.start[i];
    if (extent <= 0 && graph.duration(op) <= 0) continue;
    const Stream& s = graph.streams()[graph.stream(op)];
    json_.begin_object();
    json_.key("name").string(graph.labels().empty() ? std::string_view("op") : graph.labels()[graph.op_label(op)]);
    json_.key("ph").string("X").key("pid").integer(s.process).key("tid").integer(s.index);
    json_.key("ts").fixed((offset + replay.start[i]) * 1e6, 3);
    json_.key("dur").fixed(extent * 1e6, 3);
    json_.key("args").begin_object();
    if (graph.tag(op) >= 0) json_.key("micro_batch").integer(graph.tag(op));
    if (graph.group(op) >= 0) {
      json_.key("group").integer(graph.group(op));
      json_.key("transfer_ms").fixed(graph.duration(op) * 1e3, 3);
    }
    json_.end_object();
    json_.end_object();
  }
}

void write_chrome_trace(std::ostream& out, const OpGraph& graph, const Replay& replay,
                        const std::vector<std::string>& process_names) {
  ChromeTraceWriter writer(out);
  writer.add(graph, replay, 0, process_names);
}

double p2p_seconds(double bytes, double bandwidth, double latency) {
  if (!(bandwidth > 0)) throw std::invalid_argument("p2p_seconds: bandwidth must be positive");
  return latency + bytes / bandwidth;
}

double ring_reduce_scatter_seconds(double bytes, int members, double bandwidth, double latency) {
  if (members <= 1) return 0;
  if (!(bandwidth > 0)) throw std::invalid_argument("ring_reduce_scatter_seconds: bandwidth must be positive");
  return (members - 1) * (latency + bytes / (static_cast<double>(members) * bandwidth));
}

double ring_all_gather_seconds(double bytes, int members, double bandwidth, double latency) {
  return ring_reduce_scatter_seconds(bytes, members, bandwidth, latency);
}

double ring_all_reduce_seconds(double bytes, int members, double bandwidth, double latency) {
  return 2 * ring_reduce_scatter_seconds(bytes, members, bandwidth, latency);
}

double all_to_all_seconds(double bytes, int members, double bandwidth, double latency) {
  if (members <= 1) return 0;
  if (!(bandwidth > 0)) throw std::invalid_argument("all_to_all_seconds: bandwidth must be positive");
  return (members - 1) * (latency + bytes / (static_cast<double>(members) * bandwidth));
}

}  // namespace hdp::sim
