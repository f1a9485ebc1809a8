#pragma once
// Replay of an operation dependency graph (the "what-if" analysis of Lin et al.,
// "Understanding Stragglers in Large Model Training Using What-if Analysis", OSDI
// 2025, its section on the what-if method): every operation runs on one stream of one process, takes a
// duration, and may wait for other operations. The replay computes, for every
// operation, when it starts and ends, and the makespan of the whole graph.
//
// The engine knows nothing of training. whatif/step_simulation.h builds the
// graph of one planned training step from a cost model; a recorded trace (op
// type, stream, start, end, peers) can be replayed with the same engine, with
// its real or with idealised durations (replay's `durations` argument).
//
// Rules:
// - Streams are sequential: an operation starts no earlier than the end of the
//   operation added to its stream before it (in-stream order = insertion order).
// - Dependencies: an operation starts no earlier than the end of each of its
//   dependencies.
// - Groups (a collective, or a send/receive pair): a member's start is as above;
//   the group's transfer starts when ALL members have started (the latest start),
//   and member m ends at that latest start + m's duration. So a member that
//   starts early waits, on its stream, for its peers; its duration is only the
//   transfer time. An ungrouped operation ends at start + duration.
// - The replay is exact longest-path arithmetic in O(operations + dependencies):
//   no resource contention beyond the streams is modelled.

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/json_writer.h"

namespace hdp::sim {

using OpId = uint32_t;

// A graph that cannot be replayed: a dependency on a missing operation, a cycle
// (through dependencies, stream order and groups) or a group whose members wait
// for each other in different orders (a deadlock). The message names the first
// stuck operations.
class SimulationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Stream {
  int process = 0;   // e.g. a rank: the Chrome trace "pid"
  std::string name;  // e.g. "compute": the Chrome trace thread name
  int index = 0;     // the stream's number within its process: the Chrome trace "tid"
};

class OpGraph {
 public:
  // A stream of `process`; streams of one process are numbered 0, 1, ... in the
  // order they are added.
  int add_stream(int process, std::string name);
  // A label names a kind of operation ("forward", "grad reduce-scatter", ...);
  // equal names give the same label.
  uint32_t label(const std::string& name);
  // A new, empty group (collective or send/receive pair).
  int new_group();

  // Appends an operation to `stream`. `tag` is free for the caller (for example
  // the micro-batch); it appears in traces. Returns the operation's id (ids are
  // consecutive from 0). Dependencies may name operations added later.
  OpId add_op(int stream, double duration, uint32_t label, std::span<const OpId> deps = {}, int group = -1,
              int64_t tag = -1);
  OpId add_op(int stream, double duration, uint32_t label, std::initializer_list<OpId> deps, int group = -1,
              int64_t tag = -1) {
    return add_op(stream, duration, label, std::span<const OpId>(deps.begin(), deps.size()), group, tag);
  }
  void add_dependency(OpId op, OpId depends_on);

  size_t size() const { return stream_.size(); }
  size_t dependencies() const { return edges_.size(); }
  size_t num_groups() const { return group_size_.size(); }
  const std::vector<Stream>& streams() const { return streams_; }
  const std::vector<std::string>& labels() const { return labels_; }

  int stream(OpId op) const { return stream_[op]; }
  double duration(OpId op) const { return duration_[op]; }
  void set_duration(OpId op, double seconds) { duration_[op] = seconds; }
  uint32_t op_label(OpId op) const { return label_[op]; }
  int group(OpId op) const { return group_[op]; }
  int64_t tag(OpId op) const { return tag_[op]; }
  const std::vector<double>& durations() const { return duration_; }
  const std::vector<std::pair<OpId, OpId>>& edges() const { return edges_; }  // (from, to)

  // A short description for messages: "rank 3 compute: forward (tag 2)".
  std::string describe(OpId op) const;

 private:
  std::vector<Stream> streams_;
  std::vector<int> streams_per_process_;
  std::vector<std::string> labels_;
  std::vector<int> stream_;
  std::vector<double> duration_;
  std::vector<uint32_t> label_;
  std::vector<int> group_;
  std::vector<int64_t> tag_;
  std::vector<int> group_size_;
  std::vector<std::pair<OpId, OpId>> edges_;
};

struct Replay {
  std::vector<double> start;  // per operation
  std::vector<double> end;    // per operation
  double makespan = 0;        // the latest end (0 for an empty graph)
  // Per stream: the sum over its operations of (end - start), i.e. including the
  // time a group member waits for its peers; and the sum of durations alone.
  std::vector<double> stream_occupied, stream_busy;
};

// The order in which a graph's operations can run, computed once, so that many
// what-ifs on one graph (the straggler analysis replays a step once per op type,
// DP rank and PP rank, Lin et al. OSDI 2025) each cost one linear sweep over
// the operations and their predecessors instead of rebuilding the graph's
// adjacency. The order does not depend on durations: which operation can run
// next is a question of dependencies, stream order and groups only.
class ReplayPlan {
 public:
  // Throws SimulationError on a dependency outside the graph, a cycle or a
  // deadlock (naming the first stuck operations).
  explicit ReplayPlan(const OpGraph& graph);

  // Start and end of every operation with these durations (one per operation;
  // not checked here, replay() checks them); returns the makespan.
  double sweep(std::span<const double> durations, std::vector<double>& start, std::vector<double>& end) const;
  size_t size() const { return order_.size(); }

  // The same in run order: position i is operation order()[i]; durations, start
  // and end are by position. Many what-ifs on one graph sweep this way, their
  // arrays read front to back (the predecessors of a position mostly lie just
  // before it), several times faster than by operation id on large graphs.
  const std::vector<OpId>& order() const { return order_; }
  double sweep_in_order(std::span<const double> durations, std::vector<double>& start,
                        std::vector<double>& end) const;

 private:
  // Predecessors (dependencies and the previous operation of the stream) of each
  // position, as positions, in CSR form.
  std::vector<uint32_t> pred_offsets_;
  std::vector<uint32_t> preds_;
  // Release events in order: event e covers ops order_[event_offsets_[e] ..
  // event_offsets_[e + 1]); an event of several operations is one group, whose
  // members end together at their latest start plus their own duration.
  std::vector<uint32_t> event_offsets_;
  std::vector<OpId> order_;
  std::vector<char> grouped_;  // per event: a group (even of one member) or a plain op
};

// Replays the graph; `durations` (one per operation) replaces the graph's own
// durations when given. Throws SimulationError on a negative or non-finite
// duration, a dependency outside the graph, a cycle or a deadlock.
Replay replay(const OpGraph& graph, std::span<const double> durations = {});

// Chrome tracing JSON ("traceEvents", one "X" event per operation with nonzero
// extent or duration, ts/dur in microseconds, pid = stream process, tid = stream
// index; "M" events name processes and threads). process_names(pid) may be empty.
void write_chrome_trace(std::ostream& out, const OpGraph& graph, const Replay& replay,
                        const std::vector<std::string>& process_names = {});

// The same events for several graphs in one trace (the straggler analysis writes
// one ideal step after another): add() appends a graph's events shifted by
// `offset` seconds, naming each process and stream once; the destructor (or
// finish()) closes the JSON. Events stream out one per line (base/json_writer.h).
class ChromeTraceWriter {
 public:
  explicit ChromeTraceWriter(std::ostream& out);
  ~ChromeTraceWriter() { finish(); }
  void add(const OpGraph& graph, const Replay& replay, double offset = 0,
           const std::vector<std::string>& process_names = {});
  void finish();

 private:
  std::ostream& out_;
  JsonWriter json_;
  bool finished_ = false;
  std::vector<std::vector<bool>> named_;  // [process][stream index]; stream -1 = the process
};

// Transfer-time formulas for the durations of communication operations (bytes
// per member; bandwidth in bytes/s per member and direction; latency per hop):
// - point to point: latency + bytes / bandwidth;
// - ring reduce-scatter or all-gather of `bytes` (the whole buffer) over n
//   members: (n - 1) (latency + bytes / (n bandwidth));
// - ring all-reduce: twice that;
// - all-to-all of `bytes` (a member's whole buffer, 1 / n of it for each member)
//   over n members, pairwise exchanges: (n - 1) (latency + bytes / (n bandwidth)),
//   the same as a reduce-scatter: each member sends and receives (n - 1) / n of it.
// Zero for n <= 1.
double p2p_seconds(double bytes, double bandwidth, double latency);
double ring_reduce_scatter_seconds(double bytes, int members, double bandwidth, double latency);
double ring_all_gather_seconds(double bytes, int members, double bandwidth, double latency);
double ring_all_reduce_seconds(double bytes, int members, double bandwidth, double latency);
double all_to_all_seconds(double bytes, int members, double bandwidth, double latency);

}  // namespace hdp::sim
