#pragma once
// Which implementation runs attention on a CUDA device: our FlashAttention-2
// kernels (kernels/cuda/attention.cu), which are the reference and the fallback, or
// cuDNN's fused scaled-dot-product attention (kernels/cuda/cudnn_attention.cpp).
// One process-wide choice, read by the attention ops' dispatch (kernels/ops.cpp);
// the CPU backend and the guarded device always run their own kernels.
//
//   own    our kernels for every call.
//   cudnn  cuDNN for every call; a call it cannot take is an error that says why
//          (CudnnAttentionRefused), so a measurement of cuDNN measures cuDNN.
//   auto   cuDNN where it runs the call (bf16 on sm_90 or sm_100 with cuDNN 9.10.2
//          or newer, cudnn_attention_supported below, and a graph cuDNN builds),
//          our kernels for the rest (fp32, ring attention's blocks, older GPUs).
//          Set by measurement: on an H200 (bench/gpu_session.sh, 2026-11-28) the
//          selftest's [bf16, cudnn] rows pass, tiny-llama's first 5 bf16 losses
//          equal the CPU's to 1.2e-5, and bench-llama-1b's bf16 step takes 224 ms
//          with cuDNN's attention against 527 ms with ours (docs/performance.md).
//
// cuDNN's backward accumulates dQ with atomics, so unlike our kernels its
// gradients are not bit-identical from run to run (a deterministic cuDNN backward
// on packed documents needs a workspace quadratic in T): a bf16 run on a GPU that
// must resume bit-exactly sets train.attention: own.

#include <cstdint>
#include <stdexcept>
#include <string>

#include "base/enum_names.h"
#include "kernels/dtype.h"

namespace hdp {

enum class AttentionImpl { Auto, Cudnn, Own };

// The names a config writes (train.attention).
inline constexpr EnumName<AttentionImpl> kAttentionImplNames[] = {
    {AttentionImpl::Auto, "auto", "cuDNN where it runs the call, our kernels elsewhere (kernels/attention_impl.h)"},
    {AttentionImpl::Cudnn, "cudnn", "cuDNN's fused attention, an error where it cannot run"},
    {AttentionImpl::Own, "own", "our FlashAttention-2 kernels"}};

// The process-wide choice (default auto); takes effect from the next attention call.
void set_attention_impl(AttentionImpl impl);
AttentionImpl attention_impl();

// The process-wide choice within a scope; the previous one is restored after.
class AttentionImplScope {
 public:
  explicit AttentionImplScope(AttentionImpl impl) : previous_(attention_impl()) { set_attention_impl(impl); }
  ~AttentionImplScope() { set_attention_impl(previous_); }
  AttentionImplScope(const AttentionImplScope&) = delete;
  AttentionImplScope& operator=(const AttentionImplScope&) = delete;

 private:
  AttentionImpl previous_;
};

// What cuDNN the process can use (kernels/cuda/cudnn_attention.h probes it once).
struct CudnnRuntime {
  std::string unavailable;  // why cuDNN cannot be used at all; empty when it can
  int sm_version = 0;       // the device's compute capability, 90 for sm_90
  int64_t version = 0;      // cudnnGetVersion(): 91900 for 9.19.0
};

// One attention call as the choice sees it.
struct CudnnAttentionCall {
  DType dtype = DType::F32;  // of q, k, v, out (and the gradients)
  int64_t tokens = 0;        // T
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  bool blocks = false;       // ring attention's blocks interface (kernels/ops.h)
  bool aligned = true;       // every operand's address a multiple of 16 bytes
};

// The oldest cuDNN taken: packed documents with grouped-query heads need 9.6, and
// 9.10.0 and 9.10.1 have known faults in their SDPA (cuDNN's frontend refuses them).
inline constexpr int64_t kCudnnAttentionMinVersion = 91002;

// Whether cuDNN's fused attention can run `call` on `runtime`; when not, `why` (if
// given) says why. The rules are what is known before building a graph; cuDNN may
// still refuse the graph of a shape when it is built (kernels/cuda/cudnn_attention.h
// reports that as a refusal too).
bool cudnn_attention_supported(const CudnnRuntime& runtime, const CudnnAttentionCall& call, std::string* why);

// Raised by the attention ops under AttentionImpl::Cudnn for a call cuDNN cannot run.
class CudnnAttentionRefused : public std::invalid_argument {
 public:
  CudnnAttentionRefused(const char* op, const std::string& why)
      : std::invalid_argument(std::string(op) + ": attention implementation cudnn cannot run this call: " + why) {}
};

}  // namespace hdp
