#include "parallel/op_tracer.h"

#include <utility>

namespace hdp {

void OpTracer::begin(int64_t step) {
  step_ = step;
  records_.clear();
  open_op_ = nullptr;
  open_microbatch_ = -1;
  records_.reserve(256);
  active_ = this;
}

void OpTracer::end() {
  if (active_ == this) active_ = nullptr;
}

void OpTracer::record(const char* op, int microbatch, double start_us, double end_us, std::string group) {
  records_.push_back(OpRecord{op, microbatch, start_us, end_us, std::move(group)});
}

std::vector<OpRecord> OpTracer::take() { return std::exchange(records_, {}); }

std::string OpTracer::pipeline_group(bool forward, int sender, int mb) const {
  return "s" + std::to_string(step_) + (forward ? "/fwd" : "/bwd") + "/t" + std::to_string(tp_) + "/hdp" +
         std::to_string(hdp_) + "/p" + std::to_string(sender) + "/m" + std::to_string(mb);
}

std::string OpTracer::stage_group(const char* name) const {
  return "s" + std::to_string(step_) + "/" + name + "/t" + std::to_string(tp_) + "/p" + std::to_string(pp_);
}

std::string OpTracer::world_group(const char* name) const { return "s" + std::to_string(step_) + "/" + name; }

}  // namespace hdp
