#include "run/step_tracer.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <stdexcept>

#include "parallel/device_ops.h"
#include "whatif/trace.h"

namespace hdp {

std::string StepTracer::directory(const TraceConfig& config, const std::string& run_dir) {
  return config.dir.empty() ? run_dir + "/trace" : config.dir;
}

StepTracer::StepTracer(const TraceConfig& config, const std::string& run_dir, const GridCoords& coords, int rank,
                       Communicator& world)
    : every_(config.every), steps_(config.steps), rank_(rank), world_(&world) {
  if (every_ == 0) return;
  const std::string dir = directory(config, run_dir);
  std::filesystem::create_directories(dir);
  char name[32];
  std::snprintf(name, sizeof name, "/rank-%05d.jsonl", rank);
  path_ = dir + name;
  file_.open(path_, std::ios::trunc);
  if (!file_) throw std::runtime_error(path_ + ": cannot write the trace file");
  tracer_ = std::make_unique<OpTracer>(coords.pp_rank, coords.hdp_rank, coords.tp_rank);
  if (rank == 0) {
    spdlog::info("tracing {} step(s) of every {} into {}/rank-*.jsonl (trainer analyze {})", steps_, every_, dir, dir);
  }
}

// Rank 0's clock is the trace's: after an all-reduce every rank leaves at about
// the same moment (within the collective's skew, microseconds on one node), reads
// its clock and learns rank 0's reading; the difference is its offset. Steady
// clocks drift apart slowly, so every traced window re-aligns.
void StepTracer::align_clock() {
  world_->all_reduce_sum(0.0);
  const double local = OpTracer::local_us();
  const double reference = world_->all_reduce_sum(rank_ == 0 ? local : 0.0);
  tracer_->set_offset_us(reference - local);
}

void StepTracer::begin(int64_t step) {
  if (!tracer_) return;
  if (write_device_records()) {
    file_.flush();
    if (!file_) throw std::runtime_error(path_ + ": cannot write the trace file");
  }
  if (!traced(step)) return;
  if (!aligned_ || (step - 1) % every_ == 0) align_clock();
  aligned_ = true;
  tracer_->begin(step);
}

void StepTracer::end() {
  if (!tracer_ || OpTracer::active() != tracer_.get()) return;
  tracer_->end();
  const int64_t step = tracer_->step();
  for (const OpRecord& r : tracer_->take()) {
    write_trace_line(file_, step, r.microbatch, tracer_->pp_rank(), tracer_->hdp_rank(), tracer_->tp_rank(), r.op,
                     r.start_us, r.end_us, r.group, rank_);
    file_ << '\n';
  }
  write_device_records();
  file_.flush();
  if (!file_) throw std::runtime_error(path_ + ": cannot write the trace file");
}

// Device operations (NCCL) finish after the host moved on, often after their
// step ended: their records are written when a poll finds them finished, at the
// end of a traced step or the start of a later one, each with its own step.
bool StepTracer::write_device_records() {
  device_ops().poll();
  const std::vector<DeviceTraceRecord> records = device_ops().take_trace_records();
  for (const DeviceTraceRecord& d : records) {
    const OpRecord& r = d.record;
    write_trace_line(file_, d.step, r.microbatch, tracer_->pp_rank(), tracer_->hdp_rank(), tracer_->tp_rank(), r.op,
                     r.start_us, r.end_us, r.group, rank_);
    file_ << '\n';
  }
  return !records.empty();
}

}  // namespace hdp
