#include "kernels/attention_impl.h"

#include <atomic>

namespace hdp {
namespace {
std::atomic<AttentionImpl> g_attention_impl{AttentionImpl::Auto};

bool refuse(std::string* why, std::string reason) {
  if (why) *why = std::move(reason);
  return false;
}
}  // namespace

void set_attention_impl(AttentionImpl impl) { g_attention_impl.store(impl); }
AttentionImpl attention_impl() { return g_attention_impl.load(); }

bool cudnn_attention_supported(const CudnnRuntime& runtime, const CudnnAttentionCall& call, std::string* why) {
  if (!runtime.unavailable.empty()) return refuse(why, runtime.unavailable);
  if (call.blocks)
    return refuse(why, "ring attention's blocks interface (rectangles of rows at true positions, merged over calls "
                       "through out and lse) has no cuDNN counterpart");
  if (call.dtype != DType::BF16)
    return refuse(why, std::string(dtype_name(call.dtype)) +
                           " operands: cuDNN's fused attention is used in bf16 only (fp32 runs our exact or TF32 "
                           "kernels)");
  // Packed documents take packed statistics in the backward, which cuDNN refuses on
  // sm_8x and sm_12x (and before 9.18.1 it has no packed layout below sm_90 at all).
  if (runtime.sm_version < 90 || runtime.sm_version / 10 == 12)
    return refuse(why, "sm_" + std::to_string(runtime.sm_version) +
                           ": cuDNN's attention over packed documents runs on sm_90 and sm_100 (on sm_8x and "
                           "sm_12x its backward cannot read packed log-sum-exp statistics)");
  if (runtime.version < kCudnnAttentionMinVersion)
    return refuse(why, "cuDNN " + std::to_string(runtime.version) + " is older than " +
                           std::to_string(kCudnnAttentionMinVersion) +
                           " (9.10.2), the oldest whose packed grouped-query attention has no known fault");
  // Head dims both directions take on every architecture: multiples of 8 (16-byte
  // rows of bf16) up to 128 (sm_100's backward; sm_90 goes to 256).
  if (call.head_dim <= 0 || call.head_dim % 8 != 0 || call.head_dim > 128)
    return refuse(why, "head dim " + std::to_string(call.head_dim) +
                           ": cuDNN's fused attention takes multiples of 8 up to 128");
  if (call.kv_heads <= 0 || call.q_heads % call.kv_heads != 0)
    return refuse(why, std::to_string(call.q_heads) + " query heads are not a multiple of " +
                           std::to_string(call.kv_heads) + " key/value heads");
  // The graph's sequence bound S is T, and cuDNN's backward refuses s_q = s_kv = 1.
  if (call.tokens < 2) return refuse(why, "T=" + std::to_string(call.tokens) + ": cuDNN's backward needs T >= 2");
  if (!call.aligned)
    return refuse(why, "an operand's address is not a multiple of 16 bytes (cuDNN's kernels load 16-byte vectors)");
  if (why) why->clear();
  return true;
}

}  // namespace hdp
