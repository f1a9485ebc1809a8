#pragma once
// Per-step training metrics: one JSON object per line in RUN_DIR/metrics.jsonl.

#include <cstdint>
#include <string>
#include <vector>

#include "base/errors.h"

namespace hdp {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  int64_t tokens = 0;         // predicted tokens this step (the loss denominator)
  int64_t input_tokens = 0;   // tokens run through the model this step
  int64_t rank_tokens = 0;    // of which in rank 0's micro-batches (its pipeline's share)
  int64_t micro_batches = 0;
  double tokens_per_s = 0;    // input tokens per second of step time
  double step_ms = 0;
  double time = 0;            // Unix time in seconds when the step ended (for ETTR, trainer/ettr.h)
  double data_wait_ms = 0;    // time the step waited for its batch
  double mfu = 0;             // model FLOP/s divided by the peak FLOP/s
  int64_t peak_mem_bytes = 0;
  // Bytes rank 0 sent this step through its tensor-, pipeline-, hybrid-data- and
  // expert-parallel groups (parallel/communicator.h says how they are counted).
  int64_t tp_bytes = 0;
  int64_t pp_bytes = 0;
  int64_t hdp_bytes = 0;
  int64_t ep_bytes = 0;       // Mixtral's token dispatch and combine (parallel.ep)
  // Ring attention traffic of the whole job this step (point-to-point bytes on the
  // hdp groups of every rank).
  int64_t attention_bytes = 0;
  // Per-rank time in forward and backward, and the mean fraction of the step the
  // ranks spent waiting (1 - mean busy / step time).
  double busy_ms_min = 0;
  double busy_ms_max = 0;
  double idle_fraction = 0;
  // The plan's prediction of the busiest rank's busy time, and the cost model's
  // relative error against the measured busy_ms_max.
  double planned_busy_ms_max = 0;
  double cost_model_error = 0;
  // The step time no plan of this step's sequences beats under the same cost model
  // (planning/step_bound.h), without the gradient synchronisation: step_ms over it
  // says how far the run is from its best possible step.
  double planned_bound_ms = 0;
  // Per training rank: measured and planned busy time.
  std::vector<double> busy_ms;
  std::vector<double> planned_busy_ms;
  // Activation memory: the device peak of this step's micro-batches and the host
  // pool (offload), on rank 0.
  int64_t activation_peak_bytes = 0;
  int64_t host_pool_bytes = 0;
  int64_t offloaded_bytes = 0;  // activations the whole job copied to host memory this step
  // Mixtral only (absent otherwise): the step's load-balancing loss (its
  // model.router_aux_loss_coef multiple is in `loss`), the (token, choice) pairs each
  // expert received over all layers, and the busiest expert's count over the mean.
  bool moe = false;
  double aux_loss = 0;
  std::vector<int64_t> expert_tokens;
  double expert_load_max_over_mean = 0;
  // Steps since step 1 whose optimizer update the numerical guard skipped, this one
  // included (run/numerical_guard.h); carried over a resume by the checkpoint.
  int64_t skipped_steps = 0;
  // Rollbacks to an earlier checkpoint so far, and the global batches they skip
  // (run/training_loop.cpp); both carried over a resume.
  int64_t rollbacks = 0;
  int64_t skipped_batches = 0;
};

std::string to_json(const StepMetrics& m);

// metrics.jsonl could not be written (a full disk, a file size limit): the run
// stops with exit code 2 naming the file rather than go on with its record lost.
class MetricsError : public InputError {
 public:
  using InputError::InputError;
};

class MetricsWriter {
 public:
  // Appends to run_dir/metrics.jsonl (creating run_dir) after the lines of steps
  // 1..resumed_step, dropping any later ones: a run resumed from the checkpoint of
  // step N reruns the steps after N, and each step should appear once. 0 starts the
  // file afresh. A line cut short (a crash mid-write) is dropped too. The file is
  // cut back in place and appended to, never replaced; the caller holds the run
  // directory's lock (checkpoint/lock.h), so no other job writes it meanwhile.
  MetricsWriter(const std::string& run_dir, int64_t resumed_step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends the step's line whole, in one write(2): the file never holds part of
  // a line. A failed or short write is undone (the file cut back to its last
  // whole line) and thrown as a MetricsError naming the file and the reason.
  void write(const StepMetrics& m);
  const std::string& path() const { return path_; }
  // A test knob (HDP_FAULT_INJECT=RANK:STEP:full-metrics, base/fault_injection.h):
  // later lines go to /dev/full, whose writes fail with ENOSPC as on a full disk.
  void fail_writes_as_on_a_full_disk();

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;  // bytes of whole lines in the file
};

}  // namespace hdp
