// The device side of cuDNN attention's packed layout: the kernels run the index
// maps of kernels/cuda/cudnn_attention_plan.h (checked on the CPU by
// tests/kernels_cudnn_plan_test.cpp) over the tables and statistics of one call.

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cudnn_attention_layout.h"
#include "kernels/cuda/cudnn_attention_plan.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ragged_tables_kernel(const int32_t* __restrict__ cu_seqlens, int64_t docs, int64_t batch,
                                     int64_t q_heads, int64_t kv_heads, int64_t head_dim, CudnnRaggedTables t) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b <= batch;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const cudnn_plan::RaggedEntry e = cudnn_plan::ragged_entry(cu_seqlens, docs, b, q_heads, kv_heads, head_dim);
    t.q_offset[b] = e.q_offset;
    t.kv_offset[b] = e.kv_offset;
    t.stats_offset[b] = e.stats_offset;
    if (b < batch) t.length[b] = e.length;
  }
}

// lse[h, t] = stats[t, h] for the rows t of documents.
__global__ void stats_to_lse_kernel(const float* __restrict__ stats, float* __restrict__ lse,
                                    const int32_t* __restrict__ cu_seqlens, int64_t docs, int64_t tokens,
                                    int64_t q_heads) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * q_heads;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (cudnn_plan::in_documents(i % tokens, cu_seqlens, docs))
      lse[i] = stats[cudnn_plan::stats_to_lse_source(i, tokens, q_heads)];
}

// stats[t, h] = lse[h, t] (cuDNN reads the rows of documents only).
__global__ void lse_to_stats_kernel(const float* __restrict__ lse, float* __restrict__ stats, int64_t tokens,
                                    int64_t q_heads) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * q_heads;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    stats[i] = lse[cudnn_plan::lse_to_stats_source(i, tokens, q_heads)];
}

DeviceScratch g_tables, g_stats, g_workspace;

}  // namespace

CudnnRaggedTables cudnn_ragged_tables(const int32_t* cu_seqlens, int64_t docs, int64_t batch, int64_t q_heads,
                                      int64_t kv_heads, int64_t head_dim) {
  const cudnn_plan::RaggedTablesLayout layout = cudnn_plan::ragged_tables_layout(batch);
  char* base = static_cast<char*>(g_tables.get(layout.bytes));
  const CudnnRaggedTables t{reinterpret_cast<int64_t*>(base + layout.q_offset),
                            reinterpret_cast<int64_t*>(base + layout.kv_offset),
                            reinterpret_cast<int64_t*>(base + layout.stats_offset),
                            reinterpret_cast<int32_t*>(base + layout.length)};
  ragged_tables_kernel<<<blocks_for(batch + 1, kThreads), kThreads, 0, compute_stream()>>>(
      cu_seqlens, docs, batch, q_heads, kv_heads, head_dim, t);
  HDP_CUDA_CHECK_LAUNCH("cudnn attention: ragged tables");
  return t;
}

float* cudnn_stats_buffer(int64_t tokens, int64_t q_heads) {
  return static_cast<float*>(g_stats.get(static_cast<size_t>(tokens * q_heads) * sizeof(float)));
}

void cudnn_stats_to_lse(const float* stats, float* lse, const int32_t* cu_seqlens, int64_t docs, int64_t tokens,
                        int64_t q_heads) {
  stats_to_lse_kernel<<<blocks_for(tokens * q_heads, kThreads), kThreads, 0, compute_stream()>>>(
      stats, lse, cu_seqlens, docs, tokens, q_heads);
  HDP_CUDA_CHECK_LAUNCH("cudnn attention: statistics to lse");
}

void cudnn_lse_to_stats(const float* lse, float* stats, int64_t tokens, int64_t q_heads) {
  lse_to_stats_kernel<<<blocks_for(tokens * q_heads, kThreads), kThreads, 0, compute_stream()>>>(lse, stats, tokens,
                                                                                               q_heads);
  HDP_CUDA_CHECK_LAUNCH("cudnn attention: lse to statistics");
}

void* cudnn_workspace(int64_t bytes) { return bytes > 0 ? g_workspace.get(static_cast<size_t>(bytes)) : nullptr; }

}  // namespace hdp::cuda
