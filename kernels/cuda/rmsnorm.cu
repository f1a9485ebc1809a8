// RMSNorm as Hugging Face LlamaRMSNorm on the GPU: y = w * (x * rsqrt(mean(x^2) + eps)).
//
// Forward and the dx part of the backward: one block per row (grid-stride over
// rows); the row statistics are accumulated in double (products of two floats are
// exact in double, so only the summation order differs from the CPU) and rstd is
// rounded to float once, as on the CPU. Elementwise float formulas use the _rn
// intrinsics in the CPU's evaluation order, so nvcc does not fuse them into FMAs
// (GCC may contract the CPU's dx update, so dx can differ in the last bit).
//
// dw sums over all T rows. To stay deterministic without atomics it is done in two
// kernels: the rows are cut into R fixed chunks, block (column tile, chunk) writes
// a double partial per column into a persistent device scratch [R, H], and a second
// kernel sums each column's R partials in chunk order and adds them into dw. The
// chunking depends only on (T, H), so results are the same on every run.
//
// bf16 (E = __nv_bfloat16, common.cuh): x, w, y, dy and dx are bf16, read widened;
// the statistics, rstd and dw stay fp32 (double partials), and y and dx (the fp32
// sum dx + update) are rounded once on store, as the CPU twin does.

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kColThreads = 256;
constexpr int64_t kTargetBlocks = 1024;  // blocks the dw partial kernel aims for

// Persistent scratch for the dw partials; grows only when a larger size is needed.
double* g_partials = nullptr;
size_t g_partials_bytes = 0;

double* partials(size_t count) {
  grow_stream_buffer(reinterpret_cast<void**>(&g_partials), &g_partials_bytes, count * sizeof(double));
  return g_partials;
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20)); }

template <class E>
__global__ void rmsnorm_forward_kernel(E* __restrict__ y, float* __restrict__ rstd, const E* __restrict__ x,
                                       const E* __restrict__ w, int64_t T, int64_t H, float eps) {
  __shared__ double shared[32];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const E* xr = x + t * H;
    E* yr = y + t * H;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const double v = static_cast<double>(to_f32(xr[i]));
      acc += v * v;
    }
    const double mean = block_sum(acc, shared) / static_cast<double>(H);
    const float r = static_cast<float>(1.0 / sqrt(mean + static_cast<double>(eps)));
    if (threadIdx.x == 0) rstd[t] = r;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) 
      yr[i] = from_f32<E>(__fmul_rn(to_f32(w[i]), __fmul_rn(to_f32(xr[i]), r)));
  }
}

// dx += r * (w * dy) - c * x with c = r^3 * sum((w * dy) * x) / H.
template <class E>
__global__ void rmsnorm_backward_dx_kernel(E* __restrict__ dx, const E* __restrict__ dy, const E* __restrict__ x,
                                           const E* __restrict__ w,
                                           const float* __restrict__ rstd, int64_t T, int64_t H) {
  __shared__ double shared[32];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const E* xr = x + t * H;
    const E* dyr = dy + t * H;
    E* dxr = dx + t * H;
    const float r = rstd[t];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
      acc += static_cast<double>(__fmul_rn(to_f32(w[i]), to_f32(dyr[i]))) * static_cast<double>(to_f32(xr[i]));
    const double dot = block_sum(acc, shared);
    const double rd = r;
    const float c = static_cast<float>(rd * rd * rd * dot / static_cast<double>(H));
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float g = __fmul_rn(to_f32(w[i]), to_f32(dyr[i]));
      dxr[i] = from_f32<E>(__fadd_rn(to_f32(dxr[i]), __fsub_rn(__fmul_rn(r, g), __fmul_rn(c, to_f32(xr[i])))));
    }
  }
}

// Block (column tile blockIdx.x, row chunk blockIdx.y): for each column of the tile,
// the double sum over the chunk's rows of dy * (x * r), into partial[chunk, column].
template <class E>
__global__ void rmsnorm_backward_dw_partial_kernel(double* __restrict__ partial, const E* __restrict__ dy,
                                                   const E* __restrict__ x, const float* __restrict__ rstd,
                                                   int64_t T, int64_t H, int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= H) return;
  const int64_t t0 = blockIdx.y * rows_per_chunk;
  const int64_t t1 = t0 + rows_per_chunk < T ? t0 + rows_per_chunk : T;
  double acc = 0.0;
  for (int64_t t = t0; t < t1; ++t) {
    const float r = rstd[t];
    acc += static_cast<double>(__fmul_rn(to_f32(dy[t * H + c]), __fmul_rn(to_f32(x[t * H + c]), r)));
  }
  partial[blockIdx.y * H + c] = acc;
}

// dw[c] += float(sum over chunks of partial[chunk, c]), chunks in order.
__global__ void rmsnorm_backward_dw_final_kernel(float* __restrict__ dw, const double* __restrict__ partial,
                                                 int64_t chunks, int64_t H) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < H;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (int64_t k = 0; k < chunks; ++k) acc += partial[k * H + c];
    dw[c] += static_cast<float>(acc);
  }
}

}  // namespace

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t T = x.dim(0), H = x.dim(1);
  if (T == 0) return;
  with_element_type(x.dtype, [&](auto e) {
    using E = decltype(e);
    rmsnorm_forward_kernel<<<row_blocks(T), kRowThreads, 0, compute_stream()>>>(
        elements<E>(y), rstd.f32(), elements<E>(x), elements<E>(w), T, H, eps);
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_forward");
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t T = x.dim(0), H = x.dim(1);
  if (T == 0 || H == 0) return;
  cudaStream_t stream = compute_stream();
  with_element_type(x.dtype, [&](auto e) {
    using E = decltype(e);
    rmsnorm_backward_dx_kernel<<<row_blocks(T), kRowThreads, 0, stream>>>(
        elements<E>(dx), elements<E>(dy), elements<E>(x), elements<E>(w), rstd.f32(), T, H);
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dx)");

  const int64_t col_tiles = (H + kColThreads - 1) / kColThreads;
  int64_t chunks = (kTargetBlocks + col_tiles - 1) / col_tiles;
  if (chunks > T) chunks = T;
  if (chunks < 1) chunks = 1;
  const int64_t rows_per_chunk = (T + chunks - 1) / chunks;
  chunks = (T + rows_per_chunk - 1) / rows_per_chunk;  // no empty chunk
  double* partial = partials(static_cast<size_t>(chunks * H));
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks));
  with_element_type(x.dtype, [&](auto e) {
    using E = decltype(e);
    rmsnorm_backward_dw_partial_kernel<<<grid, kColThreads, 0, stream>>>(partial, elements<E>(dy), elements<E>(x),
                                                                         rstd.f32(), T, H, rows_per_chunk);
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dw partials)");
  rmsnorm_backward_dw_final_kernel<<<blocks_for(H, kColThreads), kColThreads, 0, stream>>>(dw.f32(), partial, chunks,
                                                                                           H);
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dw)");
}

}  // namespace hdp::cuda
