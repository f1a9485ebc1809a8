#pragma once
// The step metrics as TensorBoard event files (metrics.tensorboard): one file per
// start of a run in RUN_DIR/tensorboard, so `tensorboard --logdir RUN_DIR` (or a
// folder of runs) shows them beside other frameworks' runs. The format is
// base/tfevents.h's.

#include <cstdint>
#include <string>
#include <vector>

#include "base/tfevents.h"
#include "run/metrics.h"

namespace hdp {

// Every number of metrics.jsonl's line as a TensorBoard scalar, tagged with its
// key ("loss", "grad_norm", ...); a per-rank list as one tag per rank
// ("busy_ms/rank_3"), the experts' token counts as one per expert
// ("expert_tokens/expert_2"). `step` and `time` are the event's own fields.
std::vector<tfevents::Scalar> tensorboard_scalars(const StepMetrics& m);

class TensorBoardWriter {
 public:
  // Starts RUN_DIR/tensorboard/events.out.tfevents.<unix seconds>.<host>.<pid>
  // (creating the folder) with the file-version event. A run resumed from step N
  // (N > 0) marks a session start at step N + 1, so that TensorBoard drops the
  // later steps an earlier file holds, which this run reruns.
  TensorBoardWriter(const std::string& run_dir, const std::string& hostname, int64_t resumed_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends the step's scalars as one event, in one write(2); a failed write
  // throws a MetricsError naming the file.
  void write(const StepMetrics& m);
  // A rollback to the checkpoint of `step`: the steps after it run again.
  void restart_after(int64_t step);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event, const std::string& what);
  std::string path_;
  int fd_ = -1;
};

}  // namespace hdp
