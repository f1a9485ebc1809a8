#pragma once
// One rank's share of a training step under tensor, pipeline and hybrid data
// parallelism: its model stage and slice, the 1F1B pipeline over its
// pipeline's micro-batches, tied-embedding synchronisation, ZeRO-1 gradient
// reduction (forward_backward), then the sharded AdamW update (apply_update).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "data/batch.h"
#include "kernels/ops.h"
#include "parallel/pipeline.h"
#include "parallel/process_groups.h"
#include "parallel/zero_optimizer.h"
#include "config/config.h"
#include "model/model.h"

namespace hdp {

// The test knob HDP_SLOW_RANK=RANK:FACTOR (FACTOR >= 1): world rank RANK's
// forward and backward compute take FACTOR times as long (a sleep after each),
// as on a slow GPU; 1 for every other rank and without the variable. Throws
// InputError on a malformed value. For the straggler analysis's tests.
double slow_rank_factor(int rank);

// The most tokens one of this config's micro-batches can hold (more than
// data.micro_batch_tokens when offload or planned recomputation lets a rank hold
// more of a long sequence, may_offload and may_plan_recompute, config/config.h).
int64_t largest_micro_batch(const Config& config);

// The most tokens of one of this config's micro-batches that offloads (the host
// pool's rows per offloadable layer): the memory limit without recomputation at the
// run's ratio, within the longest sequence. A micro-batch that recomputes k layers
// may hold more tokens, but parks them from k fewer layers, never more in all.
int64_t largest_offloaded_micro_batch(const Config& config);

// What forward_backward() learned of the step, before any update.
struct StepResult {
  double loss = 0;           // global token-level loss: sum of cross-entropies / predictions
  double grad_norm = 0;      // before clipping
  int64_t predictions = 0;   // predicted tokens in the global batch
  double busy_ms = 0;        // this rank's device time in forward and backward (ring transfers included)
  // Mixtral: the load-balancing loss of the step (each micro-batch's, weighted by its
  // share of the predictions; already in `loss` times model.router_aux_loss_coef), and
  // the (token, choice) pairs each expert received over all layers and micro-batches.
  double aux_loss = 0;
  std::vector<int64_t> expert_tokens;
};

struct MemoryReport {
  size_t parameters = 0, gradients = 0, optimizer = 0, activations = 0, pipeline = 0, ring = 0;
  size_t host_pool = 0;  // host memory for offloaded activations (not device memory)
  size_t total() const { return parameters + gradients + optimizer + activations + pipeline + ring; }
};

class TrainingEngine {
 public:
  TrainingEngine(const Config& config, ProcessGroups& groups);
  ~TrainingEngine();

  // A training step in two halves, with the caller deciding in between whether the
  // update is applied (the loop's bad-step guard and stop flags, run/training_loop.h):
  //
  // forward_backward: the 1F1B pipeline over this pipeline's micro-batches (identical
  // on every stage and tp rank of the pipeline; pipelines may have different counts),
  // the global loss and the gradients reduced over hdp (ZeRO-1's reduce-scatter) with
  // their global norm. Collective over the world. `poisoned_micro_batch` is a test
  // knob (HDP_FAULT_INJECT=RANK:STEP:nan, base/fault_injection.h): on a rank of the
  // last pipeline stage, the loss and the gradients of this rank's micro-batch with
  // this index become NaN; -1: none.
  StepResult forward_backward(std::span<const PackedMicroBatch> micro_batches, int poisoned_micro_batch = -1);
  // apply_update: clips the gradients of the last forward_backward by their norm,
  // runs AdamW on this rank's shard and all-gathers the parameters. update_number:
  // AdamW's bias-correction step, the updates applied so far + 1 (skipped steps do
  // not count). Not calling it skips the step's update: the next forward_backward
  // starts from zeroed gradients.
  void apply_update(double lr, int64_t update_number);

  LlamaModel& model() { return *model_; }
  ZeroAdamW& optimizer() { return *optimizer_; }
  const std::vector<int64_t>& stage_layers() const { return stage_layers_; }
  MemoryReport memory() const;

 private:
  class Stage;
  const Config& config_;
  ProcessGroups& groups_;
  std::vector<int64_t> stage_layers_;
  std::unique_ptr<PipelineExecutor> pipeline_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<ZeroAdamW> optimizer_;
  double slow_factor_ = 1;  // slow_rank_factor
  // The step's sums on the device (kernels/ops.h): [0] its loss, [1] its gradient's
  // squared norm (this rank's part), read back together once at the step's end.
  Arena sums_arena_;
  DoubleTensor step_sums_;
  // Device time of each micro-batch's forward and backward (StepResult::busy_ms),
  // recorded as events and read after the read-back, so timing waits for nothing.
  DeviceTimer busy_timer_;
  // The global norm of the gradients forward_backward reduced, until apply_update uses them.
  std::optional<double> pending_grad_norm_;
};

}  // namespace hdp
