#pragma once
// The one-forward-one-backward (1F1B) pipeline schedule (Narayanan et al.,
// "Memory-Efficient Pipeline-Parallel DNN Training", PipeDream-Flush, 2021): the
// order in which a stage runs its micro-batches, shared by the executor
// (parallel/pipeline.h) and the step simulator (whatif/step_simulation.h).

#include <vector>

namespace hdp {

struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
};

// One forward-one backward: stage s of p runs min(p - s - 1, m) warm-up forwards,
// then alternates forward and backward, then drains the remaining backwards.
std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches);
// Micro-batches whose forward can be in flight before their backward on that stage.
int pipeline_slots(int stage, int stages);

}  // namespace hdp
