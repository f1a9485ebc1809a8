#pragma once
// Checks a device backend op by op against the CPU backend: every op of
// kernels/ops.h runs on the same random inputs on both, and each output is
// compared. Shapes cover what training meets and what breaks kernels: packed
// documents of uneven lengths (one token, tile-unaligned, longer than a tile),
// grouped-query attention, ring-attention blocks with true positions that merge
// over several calls, sliding-window attention (documents and blocks, blocks
// wholly outside the window), a sharded vocabulary with targets outside the shard,
// the MoE block's row movement for a top-2 routing (rows gathered with repeats, and
// no token at all).
// Every op with bf16 activations is checked again in bf16 against the CPU's bf16
// twins (kernels/cpu/bf16.cpp), on the same shapes, within one bf16 step of the
// tensor's scale where a result is stored in bf16 (fp32 results keep the fp32
// tolerances; on CUDA, bf16 attention with d = 64 or 128 runs on bf16 tensor cores,
// which round P and dS as operands: kBf16TensorCoreAttentionTolerance); on CUDA
// fp32 attention runs again with TF32 on. These attention rows run our kernels
// (AttentionImpl::Own, kernels/attention_impl.h); on CUDA the documents' attention
// runs again in bf16 through cuDNN's fused attention (rows marked "cudnn", held to
// the tolerances of our bf16 tensor-core rows), and a case cuDNN cannot run (every
// case, in a build without cuDNN) is one row skipped with the reason.
//
// Error measure per output: max |device - cpu| / max |cpu| (relative to the
// tensor's scale, so near-zero elements do not dominate); NaN or Inf fails.

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.h"

namespace hdp {

struct OpCheck {
  std::string op;        // "attention_backward dq"
  std::string shape;     // "T=215 docs=5 Hq=4 Hkv=2 d=16"
  double max_abs = 0;    // max |device - cpu|
  double max_rel = 0;    // max_abs / max |cpu|
  double tolerance = 0;  // on max_rel
  bool pass = false;
  std::string skipped;   // why the check did not run (it then passes); empty when it ran
};

// The tolerance of the bf16 attention rows (out, dq, dk, dv) that run on the CUDA
// bf16 tensor-core kernels (d = 64, 128): besides the store's rounding they round P
// and dS to bf16 where those become mma operands (kernels/cuda/attention.cu), which
// the CPU twin does not. Derived by emulating that rounding on the CPU on the
// selftest's shapes (tests/kernels_mma_fragments_test.cpp: the emulated
// differences stay within half of it).
inline constexpr double kBf16TensorCoreAttentionTolerance = 2e-2;

// Runs every op on `device` and on the CPU with inputs drawn from `seed`.
// Throws (std::runtime_error) when the device cannot be used at all.
std::vector<OpCheck> check_backend(Device device, uint64_t seed);

// The checks as a table: op, shape, max abs, max rel, tolerance, pass/FAIL (or
// "skipped: " and why).
std::string format_checks(const std::vector<OpCheck>& checks);

}  // namespace hdp
