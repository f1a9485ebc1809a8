// The mixture-of-experts block's row movement on the GPU: gather (dispatch,
// permutation), the weighted combine and the combine's weight gradient, with the
// semantics of the CPU kernels (kernels/cpu/moe_rows.cpp).
//
// Gather and combine: one block per output row (grid-stride over rows), threads
// across the hidden size, so a warp reads and writes contiguous runs of a row. The
// combine sums its k terms in j order in an fp32 register per element and stores
// once: deterministic without atomics. Its products and sums use _rn intrinsics so
// nvcc does not contract them into FMAs: the CPU kernel rounds each as written too,
// so both give the same bits. The weight gradient: one warp per (t, j), each lane
// summing a strided part of the dot product in double (the CPU's precision) and a
// fixed butterfly reduction over the warp, then one rounding to fp32.
// bf16 (E = __nv_bfloat16, common.cuh): rows read widened, fp32 arithmetic, each
// result rounded once on store, as the CPU twins do.
//
// Indices are not checked on the host here (that would need a synchronizing copy;
// kernels/ops.h): a row whose index lies outside the indexed tensor reads nothing,
// a zero row in gather, a term left out in combine, a zero gradient, so a bad
// index never reads memory outside the tensor.

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20)); }

// An optional argument left out (a default Tensor): no pointer.
const float* optional_f32(const Tensor& t) { return t.ndim == 0 && t.data == nullptr ? nullptr : t.f32(); }

template <class E>
__global__ void gather_rows_kernel(E* __restrict__ out, const E* __restrict__ x, const int32_t* __restrict__ index,
                                   const float* __restrict__ scale, int64_t N, int64_t T, int64_t H) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const int64_t row = index[r];
    E* dst = out + r * H;
    if (row < 0 || row >= T) {  // uniform over the block
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dst[c] = from_f32<E>(0.0f);
      continue;
    }
    const E* src = x + row * H;
    if (scale == nullptr) {
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dst[c] = src[c];
    } else {
      const float s = scale[r];
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) dst[c] = from_f32<E>(__fmul_rn(s, to_f32(src[c])));
    }
  }
}

template <class E>
__global__ void combine_rows_kernel(E* __restrict__ out, const E* __restrict__ rows, const int32_t* __restrict__ index,
                                    const float* __restrict__ weights, int64_t T, int64_t k, int64_t N, int64_t H) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t* idx = index + t * k;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = idx[j];
        if (row < 0 || row >= N) continue;
        const float v = to_f32(rows[row * H + c]);
        acc = __fadd_rn(acc, weights == nullptr ? v : __fmul_rn(weights[t * k + j], v));
      }
      out[t * H + c] = from_f32<E>(acc);
    }
  }
}

// Warp w of the grid takes pairs p = w, w + warps, ... of the T * k (t, j) pairs; the
// loop bound is uniform over a warp, so every lane takes part in each reduction.
template <class E>
__global__ void combine_rows_weight_backward_kernel(float* __restrict__ dweights, const E* __restrict__ dout,
                                                    const E* __restrict__ rows, const int32_t* __restrict__ index,
                                                    int64_t pairs, int64_t k, int64_t N, int64_t H) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t p = blockIdx.x * warps_per_block + (threadIdx.x >> 5); p < pairs; p += stride) {
    const int64_t row = index[p];
    double dot = 0;
    if (row >= 0 && row < N) {
      const E* g = dout + (p / k) * H;
      const E* src = rows + row * H;
      for (int64_t h = lane; h < H; h += 32)
        dot += static_cast<double>(to_f32(g[h])) * static_cast<double>(to_f32(src[h]));
    }
    dot = warp_sum(dot);
    if (lane == 0) dweights[p] = static_cast<float>(dot);
  }
}

}  // namespace

void gather_rows(Tensor out, const Tensor& x, const IndexTensor& index, const Tensor& scale) {
  const int64_t N = index.numel(), T = x.dim(0), H = x.dim(1);
  if (N == 0 || H == 0) return;
  with_element_type(out.dtype, [&](auto e) {
    using E = decltype(e);
    gather_rows_kernel<<<row_blocks(N), kThreads, 0, compute_stream()>>>(elements<E>(out), elements<E>(x), index.data,
                                                                         optional_f32(scale), N, T, H);
  });
  HDP_CUDA_CHECK_LAUNCH("gather_rows");
}

void combine_rows(Tensor out, const Tensor& rows, const IndexTensor& index, const Tensor& weights) {
  const int64_t T = index.dim(0), k = index.dim(1), N = rows.dim(0), H = rows.dim(1);
  if (T == 0 || H == 0) return;
  with_element_type(out.dtype, [&](auto e) {
    using E = decltype(e);
    combine_rows_kernel<<<row_blocks(T), kThreads, 0, compute_stream()>>>(
        elements<E>(out), elements<E>(rows), index.data, optional_f32(weights), T, k, N, H);
  });
  HDP_CUDA_CHECK_LAUNCH("combine_rows");
}

void combine_rows_weight_backward(Tensor dweights, const Tensor& dout, const Tensor& rows, const IndexTensor& index) {
  const int64_t pairs = index.numel(), k = index.dim(1), N = rows.dim(0), H = rows.dim(1);
  if (pairs == 0) return;  // with H = 0 the kernel still runs and writes zeros
  with_element_type(dout.dtype, [&](auto e) {
    using E = decltype(e);
    combine_rows_weight_backward_kernel<<<blocks_for(pairs * 32, kThreads), kThreads, 0, compute_stream()>>>(
        dweights.f32(), elements<E>(dout), elements<E>(rows), index.data, pairs, k, N, H);
  });
  HDP_CUDA_CHECK_LAUNCH("combine_rows_weight_backward");
}

}  // namespace hdp::cuda
