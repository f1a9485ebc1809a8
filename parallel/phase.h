#pragma once
// One phase of a rank's step as both views of a job see it: the op tracer's span
// (parallel/op_tracer.h: what the what-if analysis replays) and the progress
// marker's context (parallel/progress.h: what the hang watchdog reports). Where
// code opens both for the same work it opens a Phase, so that the two always
// cover the same time and cannot drift apart. Code that feeds only one view (a
// nested communication span, a label around a whole schedule) keeps its
// TraceSpan or progress::Context.

#include <string>
#include <utility>

#include "parallel/op_tracer.h"
#include "parallel/progress.h"

namespace hdp {

class Phase {
 public:
  // `op`: one of whatif/trace.h's trace_ops names; `label`: the hang report's
  // words for it. Both string literals. `microbatch`: -1 for per-step work.
  Phase(const char* op, const char* label, int microbatch = -1) : context_(label), span_(op, microbatch) {}
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

  // The tracer recording this step, or null: group names are built only when it is set.
  OpTracer* tracer() const { return span_.tracer(); }
  void set_group(std::string group) { span_.set_group(std::move(group)); }

 private:
  progress::Context context_;  // opened first, so the span's record ends inside it
  TraceSpan span_;
};

}  // namespace hdp
