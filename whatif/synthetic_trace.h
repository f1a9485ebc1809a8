#pragma once
// Synthetic op traces with a known answer, for the straggler analysis's tests and
// benchmark: a job of pp stages x dp pipelines running 1F1B
// (planning/pipeline_schedule.h) is built as an op graph (whatif/simulator.h) with
// chosen durations, replayed, and every op recorded with its replayed start and
// end, as the trainer's tracer would record it (whatif/trace.h). Per step and
// worker: forward and backward compute per micro-batch, pipeline sends and
// receives (send/receive pairs grouped), then the tail chain of Lin et al.
// (OSDI 2025): the last backward -> grads-sync (a collective over the DP ranks of
// the stage) -> optimizer -> params-sync (likewise).

#include <cstdint>

#include "whatif/trace.h"

namespace hdp {

struct SyntheticJob {
  int pp = 4, dp = 8, micro_batches = 8;
  int64_t steps = 4;
  double forward_us = 1000, backward_us = 2000;  // per micro-batch and stage
  double transfer_us = 50;                        // a pipeline send's transfer
  double grads_sync_us = 400, optimizer_us = 200, params_sync_us = 300;
  double last_stage_factor = 1;  // compute of the last stage (LM head and loss)
  int slow_pp = -1, slow_dp = -1;  // one slow worker, its compute stretched by slow_factor
  double slow_factor = 1;
  // Sequence-length imbalance: each micro-batch (step, dp rank, index) scales the
  // compute of both passes on every stage by exp(sequence_skew x z), z ~ N(0, 1).
  double sequence_skew = 0;
  double noise = 0;  // every duration times an independent uniform factor in [1 - noise, 1 + noise]
  uint64_t seed = 1;
};

Trace synthesize_trace(const SyntheticJob& job);

}  // namespace hdp
