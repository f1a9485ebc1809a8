// Token embedding over a (possibly vocabulary-sliced) table on the GPU.
//
// One block per token row (grid-stride over rows), threads across the hidden size,
// so every warp reads and writes contiguous 128-byte runs of a row. Tokens outside
// [vocab_begin, vocab_begin + V) give zero rows in the forward and are skipped in
// the backward. The backward accumulates with atomicAdd (repeated tokens hit the
// same table row from different blocks), so its summation order, unlike the CPU's
// token order, may vary from run to run in the last bits.

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20)); }

template <class E>
__global__ void embedding_forward_kernel(E* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const E* __restrict__ table, int64_t T, int64_t V, int64_t H,
                                         int64_t vocab_begin) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t row = static_cast<int64_t>(tokens[t]) - vocab_begin;
    E* dst = out + t * H;
    if (row >= 0 && row < V) {
      const E* src = table + row * H;
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dst[c] = src[c];
    } else {
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dst[c] = from_f32<E>(0.0f);
    }
  }
}

template <class E>
__global__ void embedding_backward_kernel(float* __restrict__ dtable, const int32_t* __restrict__ tokens,
                                          const E* __restrict__ dout, int64_t T, int64_t V, int64_t H,
                                          int64_t vocab_begin) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t row = static_cast<int64_t>(tokens[t]) - vocab_begin;
    if (row < 0 || row >= V) continue;  // uniform over the block
    float* dst = dtable + row * H;
    const E* src = dout + t * H;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) atomicAdd(dst + c, to_f32(src[c]));
  }
}

}  // namespace

void embedding_forward(Tensor out, const IndexTensor& tokens, const Tensor& table, int64_t vocab_begin) {
  const int64_t T = tokens.numel(), V = table.dim(0), H = table.dim(1);
  if (T == 0 || H == 0) return;
  with_element_type(out.dtype, [&](auto e) {
    using E = decltype(e);
    embedding_forward_kernel<<<row_blocks(T), kThreads, 0, compute_stream()>>>(
        elements<E>(out), tokens.data, elements<E>(table), T, V, H, vocab_begin);
  });
  HDP_CUDA_CHECK_LAUNCH("embedding_forward");
}

void embedding_backward(Tensor dtable, const IndexTensor& tokens, const Tensor& dout, int64_t vocab_begin) {
  const int64_t T = tokens.numel(), V = dtable.dim(0), H = dtable.dim(1);
  if (T == 0 || H == 0 || V == 0) return;
  with_element_type(dout.dtype, [&](auto e) {
    using E = decltype(e);
    embedding_backward_kernel<<<row_blocks(T), kThreads, 0, compute_stream()>>>(
        dtable.f32(), tokens.data, elements<E>(dout), T, V, H, vocab_begin);
  });
  HDP_CUDA_CHECK_LAUNCH("embedding_backward");
}

}  // namespace hdp::cuda
