#include "data/batch.h"

namespace hdp {

int64_t PackedMicroBatch::num_predictions() const {
  int64_t n = 0;
  for (int32_t t : targets) n += (t >= 0);
  return n;
}

}  // namespace hdp
