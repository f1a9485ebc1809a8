#pragma once
// The order in which a pipeline stage runs its micro-batches, shared by the
// executor (parallel/pipeline.h), the plan check (planning/plan.h) and the step
// simulator (whatif/step_simulation.h):
//
// - one forward-one backward (1F1B; Narayanan et al., "Memory-Efficient
//   Pipeline-Parallel DNN Training", PipeDream-Flush, 2021), each stage holding
//   one contiguous range of layers;
// - interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model
//   Training on GPU Clusters Using Megatron-LM", SC 2021, section 2.2.2): each of
//   the pp stages holds `chunks` (vpp) model chunks, chunk c of stage s being
//   virtual stage c x pp + s of pp x vpp, so a micro-batch passes every stage vpp
//   times and the fill and drain shrink by vpp: the bubble is (pp - 1) / (vpp m)
//   of the ideal step instead of (pp - 1) / m.

#include <vector>

namespace hdp {

struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;  // the stage's model chunk: virtual stage chunk x stages + stage
};

// One forward-one backward: stage s of p runs min(p - s - 1, m) warm-up forwards,
// then alternates forward and backward, then drains the remaining backwards.
std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches);
// Micro-batches whose forward can be in flight before their backward on that stage
// (stages - stage); with `chunks` > 1, the (micro-batch, chunk) pairs of the
// interleaved order: its warm-up plus one.
int pipeline_slots(int stage, int stages, int chunks = 1);

// Interleaved 1F1B over `chunks` model chunks per stage, in Megatron-LM's order:
// forwards go through the micro-batches in groups of `stages`, each group through
// chunk 0, 1, ..., chunks - 1; backwards the same groups with the chunks reversed.
// Stage s runs min(2 (p - s - 1) + (chunks - 1) p, chunks m) warm-up forwards, then
// one forward and one backward in turn, then the drain. Any m runs: when p does not
// divide it, the order is that of the next multiple of p with the missing
// micro-batches' operations left out.
// Throws std::invalid_argument for chunks < 1, and for chunks > 1 with one stage
// (nothing to interleave).
std::vector<PipelineOp> interleaved_one_f_one_b(int stage, int stages, int chunks, int micro_batches);

// The schedule of a stage: one_f_one_b for one chunk, interleaved_one_f_one_b for more.
std::vector<PipelineOp> pipeline_schedule(int stage, int stages, int chunks, int micro_batches);

// The pipeline bubble over the ideal step (every stage busy with its m micro-batches'
// forward and backward), for equal micro-batches and free transfers: (p - 1) / (vpp m).
double pipeline_bubble_fraction(int stages, int chunks, int micro_batches);

}  // namespace hdp
