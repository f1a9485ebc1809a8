#pragma once
// The op tracer's recorder (NDTimeline-like; the record of Lin et al.,
// "Understanding Stragglers in Large Model Training Using What-if Analysis",
// OSDI 2025): while a sampled step runs, the code that computes and communicates
// records each op (type, micro-batch, start, end, and a group name shared by the
// peers of a collective or a send/receive pair) into this rank's tracer. The
// trainer turns on one tracer per rank for the sampled steps and writes its
// records as JSONL (run/step_tracer.h, docs/tracing.md).
//
// Free when off: OpTracer::active() is one load of a pointer that is null
// outside sampled steps, and TraceSpan does nothing else then.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "whatif/trace.h"

namespace hdp {


struct OpRecord {
  const char* op = "";  // a string literal (the names of whatif/trace.h)
  int microbatch = -1;
  double start_us = 0, end_us = 0;
  std::string group;    // empty: a local op
};

class OpTracer {
 public:
  // This rank's coordinates, for group names.
  OpTracer(int pp_rank, int hdp_rank, int tp_rank) : pp_(pp_rank), hdp_(hdp_rank), tp_(tp_rank) {}

  // The tracer of the step now running on this process, or null.
  static OpTracer* active() { return active_; }
  // Starts recording `step` (this tracer becomes active) / stops (none is).
  void begin(int64_t step);
  void end();

  // Microseconds on the clock shared by the ranks: the local steady clock plus
  // the offset the trainer measured against rank 0 (set_offset_us).
  double now_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count() +
           offset_us_;
  }
  static double local_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void set_offset_us(double offset) { offset_us_ = offset; }
  double offset_us() const { return offset_us_; }

  void record(const char* op, int microbatch, double start_us, double end_us, std::string group = {});
  // The records since begin(), handed over and cleared.
  std::vector<OpRecord> take();

  int64_t step() const { return step_; }
  // The innermost open TraceSpan's op and the innermost micro-batch given (null / -1: none), which a
  // device operation enqueued inside it is named after (parallel/device_ops.h).
  const char* open_op() const { return open_op_; }
  int open_microbatch() const { return open_microbatch_; }
  int pp_rank() const { return pp_; }
  int hdp_rank() const { return hdp_; }
  int tp_rank() const { return tp_; }

  // Group names: every member computes the same name for one communication.
  // A pipeline transfer from stage `sender` (forward: to sender + 1; backward:
  // to sender - 1; under interleaved 1F1B, virtual stages) of micro-batch `mb` in
  // this rank's pipeline and tp slice.
  std::string pipeline_group(bool forward, int sender, int mb) const;
  // A collective over this stage's hdp ranks (same tp rank): "grads", "params", ...
  std::string stage_group(const char* name) const;
  // A collective over every rank: "norm", "loss".
  std::string world_group(const char* name) const;

 private:
  static inline OpTracer* active_ = nullptr;
  int pp_, hdp_, tp_;
  int64_t step_ = -1;
  double offset_us_ = 0;
  std::vector<OpRecord> records_;
  const char* open_op_ = nullptr;
  int open_microbatch_ = -1;
  friend class TraceSpan;
};

// Records the op that runs while it lives, when a traced step runs.
class TraceSpan {
 public:
  explicit TraceSpan(const char* op, int microbatch = -1) : tracer_(OpTracer::active()) {
    if (tracer_) {
      op_ = op;
      microbatch_ = microbatch;
      start_ = tracer_->now_us();
      enclosing_op_ = std::exchange(tracer_->open_op_, op);
      enclosing_microbatch_ = tracer_->open_microbatch_;
      if (microbatch >= 0) tracer_->open_microbatch_ = microbatch;  // a nested span keeps its op's
    }
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  ~TraceSpan() {
    if (!tracer_) return;
    tracer_->open_op_ = enclosing_op_;
    tracer_->open_microbatch_ = enclosing_microbatch_;
    tracer_->record(op_, microbatch_, start_, tracer_->now_us(), std::move(group_));
  }
  OpTracer* tracer() const { return tracer_; }
  void set_group(std::string group) { group_ = std::move(group); }

 private:
  OpTracer* tracer_;
  const char* op_ = "";
  int microbatch_ = -1;
  double start_ = 0;
  std::string group_;
  const char* enclosing_op_ = nullptr;
  int enclosing_microbatch_ = -1;
};

}  // namespace hdp
