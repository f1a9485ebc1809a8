#pragma once
// trainer selftest: every device-backend op and a few training steps of a small
// model against the CPU backend, printed as a table (trainer/selftest.cpp).

#include <cstdint>
#include <vector>

#include "kernels/attention_impl.h"
#include "kernels/backend_check.h"
#include "kernels/device.h"
#include "kernels/dtype.h"

namespace hdp {

struct SelftestOptions {
  uint64_t seed = 1;
};

// Five AdamW steps of a small grouped-query model on `device` and on the CPU from
// the same weights and packed batches, in `precision` (fp32, or bf16 mixed
// precision against the CPU's bf16 path): each step's loss, the first gradients
// and the final (fp32 master) weights compared. With `mixtral`, every MLP is a sparse
// mixture of 4 experts, top 2 (the MoE block's routing, row movement and
// load-balancing loss on the device). Attention runs on `attention`'s kernels
// (kernels/attention_impl.h; the CPU and the guarded device always run their own).
std::vector<OpCheck> check_model_training(Device device, uint64_t seed, DType precision = DType::F32,
                                          bool mixtral = false, AttentionImpl attention = AttentionImpl::Own);

// The copy engine on `device` (round trips through host memory, pinned on CUDA,
// whose result depends on every ordering between the copy and compute streams;
// no events created after the first round), then two micro-batches of a 4-layer
// model with offload ratio 0.5 against the CPU model and the device model without
// offload: losses, accumulated gradients and the bytes offloaded.
std::vector<OpCheck> check_offload(Device device, uint64_t seed);

// Returns the exit code: 0 when every check passes (or there is no device to
// check), 1 on any failure.
int run_selftest(const SelftestOptions& options);

}  // namespace hdp
