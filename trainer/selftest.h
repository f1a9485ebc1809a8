#pragma once
// trainer selftest: every device-backend op and a few training steps of a small
// model against the CPU backend, printed as a table (trainer/selftest.cpp).

#include <cstdint>
#include <vector>

#include "kernels/backend_check.h"
#include "kernels/device.h"

namespace hdp {

struct SelftestOptions {
  uint64_t seed = 1;
};

// Five AdamW steps of a small grouped-query model on `device` and on the CPU from
// the same weights and packed batches: each step's loss, the first gradients and
// the final weights compared.
std::vector<OpCheck> check_model_training(Device device, uint64_t seed);

// Returns the exit code: 0 when every check passes (or there is no device to
// check), 1 on any failure.
int run_selftest(const SelftestOptions& options);

}  // namespace hdp
