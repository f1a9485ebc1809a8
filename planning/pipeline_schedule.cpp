#include "planning/pipeline_schedule.h"

#include <algorithm>

namespace hdp {

std::vector<PipelineOp> one_f_one_b(int stage, int stages, int micro_batches) {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineOp> ops;
  for (int i = 0; i < warmup; ++i) ops.push_back({true, i});
  for (int k = 0; k < micro_batches - warmup; ++k) {
    ops.push_back({true, warmup + k});
    ops.push_back({false, k});
  }
  for (int k = micro_batches - warmup; k < micro_batches; ++k) ops.push_back({false, k});
  return ops;
}

int pipeline_slots(int stage, int stages) { return stages - stage; }

}  // namespace hdp
