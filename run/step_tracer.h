#pragma once
// The trainer's side of the op tracer (the `trace` config section,
// docs/tracing.md): which steps are traced, the clock shared by the ranks, and
// one JSONL file per rank in the import format of whatif/trace.h plus a
// "rank" field. The ops themselves are recorded where they run, through
// parallel/op_tracer.h.

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/op_tracer.h"
#include "spec/parallel_degrees.h"
#include "config/config.h"

namespace hdp {

class StepTracer {
 public:
  // Off (and free) when trace.every is 0. `world`: the training ranks.
  StepTracer(const TraceConfig& config, const std::string& run_dir, const GridCoords& coords, int rank,
             Communicator& world);
  // Every rank calls it at the start of every step (same steps on every rank):
  // a traced window's first step first re-aligns the clocks (a collective), then
  // a traced step records.
  void begin(int64_t step);
  // Appends the step's records to this rank's file and stops recording.
  void end();
  // RUN_DIR/trace unless trace.dir says otherwise.
  static std::string directory(const TraceConfig& config, const std::string& run_dir);

 private:
  bool traced(int64_t step) const { return every_ > 0 && (step - 1) % every_ < steps_; }
  void align_clock();
  // Writes the records of device operations that finished since the last call; true if any.
  bool write_device_records();

  int64_t every_ = 0, steps_ = 1;
  bool aligned_ = false;  // a resumed run may start inside a window
  int rank_ = 0;
  Communicator* world_ = nullptr;
  std::unique_ptr<OpTracer> tracer_;
  std::ofstream file_;
  std::string path_;
};

}  // namespace hdp
