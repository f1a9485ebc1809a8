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
  // The plan's step as the step simulator replays it under the same cost model
  // (run/step_costs.h), and its relative error against the measured step_ms,
  // step_ms / planned_step_ms - 1.
  double planned_step_ms = 0;
  double planned_step_error = 0;
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
  // Due checkpoints (steps that are multiples of train.checkpoint_every) not written
  // at their step so far, to keep checkpoints within train.checkpoint_budget
  // (run/training_loop.h); carried over a resume by the checkpoint.
  int64_t checkpoints_deferred = 0;
};

// Every field of `m` in metrics.jsonl's order, the one list that the JSON line and
// the TensorBoard scalars (run/tensorboard.h) are both written from. `v` has:
//   step(key, int64_t), time(key, double Unix seconds): the record's own fields;
//   number(key, double), count(key, int64_t): one value;
//   per_rank(key, const std::vector<double>&), per_expert(key, const std::vector<int64_t>&).
template <class Visitor>
void for_each_metric(const StepMetrics& m, Visitor& v) {
  v.step("step", m.step);
  v.number("loss", m.loss);
  v.number("lr", m.lr);
  v.number("grad_norm", m.grad_norm);
  v.count("tokens", m.tokens);
  v.count("input_tokens", m.input_tokens);
  v.count("rank_tokens", m.rank_tokens);
  v.count("micro_batches", m.micro_batches);
  v.number("tokens_per_s", m.tokens_per_s);
  v.number("step_ms", m.step_ms);
  v.time("time", m.time);
  v.number("data_wait_ms", m.data_wait_ms);
  v.number("mfu", m.mfu);
  v.count("peak_mem_bytes", m.peak_mem_bytes);
  v.count("tp_bytes", m.tp_bytes);
  v.count("pp_bytes", m.pp_bytes);
  v.count("hdp_bytes", m.hdp_bytes);
  v.count("ep_bytes", m.ep_bytes);
  v.count("attention_bytes", m.attention_bytes);
  v.number("busy_ms_min", m.busy_ms_min);
  v.number("busy_ms_max", m.busy_ms_max);
  v.number("idle_fraction", m.idle_fraction);
  v.number("planned_busy_ms_max", m.planned_busy_ms_max);
  v.number("cost_model_error", m.cost_model_error);
  v.number("planned_bound_ms", m.planned_bound_ms);
  v.number("planned_step_ms", m.planned_step_ms);
  v.number("planned_step_error", m.planned_step_error);
  v.per_rank("busy_ms", m.busy_ms);
  v.per_rank("planned_busy_ms", m.planned_busy_ms);
  v.count("activation_peak_bytes", m.activation_peak_bytes);
  v.count("host_pool_bytes", m.host_pool_bytes);
  v.count("offloaded_bytes", m.offloaded_bytes);
  v.count("skipped_steps", m.skipped_steps);
  if (m.moe) {
    v.number("aux_loss", m.aux_loss);
    v.per_expert("expert_tokens", m.expert_tokens);
    v.number("expert_load_max_over_mean", m.expert_load_max_over_mean);
  }
  v.count("rollbacks", m.rollbacks);
  v.count("skipped_batches", m.skipped_batches);
  v.count("checkpoints_deferred", m.checkpoints_deferred);
}

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
