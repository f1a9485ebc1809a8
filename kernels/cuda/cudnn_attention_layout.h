#pragma once
// The device side of cuDNN attention's packed layout (kernels/cuda/cudnn_attention_plan.h):
// the ragged offsets and lengths of a call's documents, the transposes between
// cuDNN's statistics and our lse, and the growing device buffers a call uses
// (DeviceScratch, kernels/cuda/common.cuh). Everything is enqueued on the compute
// stream. Plain C++: kernels/cuda/cudnn_attention.cpp, which the host compiler
// builds, calls it; kernels/cuda/cudnn_attention_layout.cu implements it. The
// buffers are shared by all calls: the caller serializes its calls.

#include <cstdint>

namespace hdp::cuda {

// The ragged tables of one call: int64 offsets [batch + 1] into q/out ([T, Hq, d]),
// k/v ([T, Hkv, d]) and the statistics ([T, Hq]), and int32 lengths [batch].
struct CudnnRaggedTables {
  int64_t* q_offset;
  int64_t* kv_offset;
  int64_t* stats_offset;
  int32_t* length;
};
// Fills them from cu_seqlens [docs + 1] (device memory) for a graph of `batch`
// sequences (cudnn_plan::ragged_entry), in a buffer the next call reuses.
CudnnRaggedTables cudnn_ragged_tables(const int32_t* cu_seqlens, int64_t docs, int64_t batch, int64_t q_heads,
                                      int64_t kv_heads, int64_t head_dim);

// cuDNN's statistics [T, Hq] fp32, in a buffer the next call reuses.
float* cudnn_stats_buffer(int64_t tokens, int64_t q_heads);
// lse [Hq, T] <- stats [T, Hq] on the rows of the documents of cu_seqlens [docs + 1]
// (device memory); stats <- lse on every row.
void cudnn_stats_to_lse(const float* stats, float* lse, const int32_t* cu_seqlens, int64_t docs, int64_t tokens,
                        int64_t q_heads);
void cudnn_lse_to_stats(const float* lse, float* stats, int64_t tokens, int64_t q_heads);

// cuDNN's workspace of at least `bytes` (null for none), in a buffer the next call reuses.
void* cudnn_workspace(int64_t bytes);

}  // namespace hdp::cuda
