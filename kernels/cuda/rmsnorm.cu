// RMSNorm as Hugging Face LlamaRMSNorm on the GPU: y = w * (x * rsqrt(mean(x^2) + eps)).
//
// Forward and the dx part of the backward: one block per row (grid-stride over
// rows, 16-byte packs of a row per thread where H allows); the row statistics are accumulated in double (products of two floats are
// exact in double, so only the summation order differs from the CPU) and rstd is
// rounded to float once, as on the CPU. Elementwise float formulas use the _rn
// intrinsics in the CPU's evaluation order, so nvcc does not fuse them into FMAs
// (GCC may contract the CPU's dx update, so dx can differ in the last bit).
//
// dw sums over all T rows. To stay deterministic without atomics it is done in two
// kernels: the rows are cut into R fixed chunks, block (column tile, chunk) writes
// a double partial per column into a persistent device scratch [R, H], and a second
// kernel sums each column's R partials in chunk order and adds them into dw. The
// chunking depends only on (T, H) and whether 16-byte packs fit (below), so results
// are the same on every run.
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
constexpr int64_t kTargetBlocks = 1024;  // blocks the dw partial kernel aims for with one column a thread

// Persistent scratch for the dw partials; grows only when a larger size is needed.
double* g_partials = nullptr;
size_t g_partials_bytes = 0;

double* partials(size_t count) {
  grow_stream_buffer(reinterpret_cast<void**>(&g_partials), &g_partials_bytes, count * sizeof(double));
  return g_partials;
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20)); }

// The row kernels read K elements at a time (16-byte packs where H and the pointers
// allow, common.cuh: Elements; else one): the same formulas, the double sums of a
// row in another order (their last bits may move).
template <class E, int K>
__global__ void rmsnorm_forward_kernel(E* __restrict__ y, float* __restrict__ rstd, const E* __restrict__ x,
                                       const E* __restrict__ w, int64_t T, int64_t H, float eps) {
  using P = Elements<E, K>;
  __shared__ double shared[32];
  const int64_t packs = H / K;
  const P* wp = reinterpret_cast<const P*>(w);
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + t * H);
    P* yr = reinterpret_cast<P*>(y + t * H);
    double acc = 0.0;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p];
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const double v = static_cast<double>(to_f32(xv.v[j]));
        acc += v * v;
      }
    }
    const double mean = block_sum(acc, shared) / static_cast<double>(H);
    const float r = static_cast<float>(1.0 / sqrt(mean + static_cast<double>(eps)));
    if (threadIdx.x == 0) rstd[t] = r;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], wv = wp[p];
      P yv;
#pragma unroll
      for (int j = 0; j < K; ++j) yv.v[j] = from_f32<E>(__fmul_rn(to_f32(wv.v[j]), __fmul_rn(to_f32(xv.v[j]), r)));
      yr[p] = yv;
    }
  }
}

// dx += r * (w * dy) - c * x with c = r^3 * sum((w * dy) * x) / H.
template <class E, int K>
__global__ void rmsnorm_backward_dx_kernel(E* __restrict__ dx, const E* __restrict__ dy, const E* __restrict__ x,
                                           const E* __restrict__ w, const float* __restrict__ rstd, int64_t T,
                                           int64_t H) {
  using P = Elements<E, K>;
  __shared__ double shared[32];
  const int64_t packs = H / K;
  const P* wp = reinterpret_cast<const P*>(w);
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(x + t * H);
    const P* dyr = reinterpret_cast<const P*>(dy + t * H);
    P* dxr = reinterpret_cast<P*>(dx + t * H);
    const float r = rstd[t];
    double acc = 0.0;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], wv = wp[p], dyv = dyr[p];
#pragma unroll
      for (int j = 0; j < K; ++j)
        acc += static_cast<double>(__fmul_rn(to_f32(wv.v[j]), to_f32(dyv.v[j]))) * static_cast<double>(to_f32(xv.v[j]));
    }
    const double dot = block_sum(acc, shared);
    const double rd = r;
    const float c = static_cast<float>(rd * rd * rd * dot / static_cast<double>(H));
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], wv = wp[p], dyv = dyr[p];
      P dxv = dxr[p];
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const float g = __fmul_rn(to_f32(wv.v[j]), to_f32(dyv.v[j]));
        dxv.v[j] = from_f32<E>(__fadd_rn(to_f32(dxv.v[j]), __fsub_rn(__fmul_rn(r, g), __fmul_rn(c, to_f32(xv.v[j])))));
      }
      dxr[p] = dxv;
    }
  }
}

// Block (column tile blockIdx.x, row chunk blockIdx.y): for each column of the tile,
// K columns a thread, the double sum over the chunk's rows of dy * (x * r), into
// partial[chunk, column] (each column's rows in order, whatever K).
template <class E, int K>
__global__ void rmsnorm_backward_dw_partial_kernel(double* __restrict__ partial, const E* __restrict__ dy,
                                                   const E* __restrict__ x, const float* __restrict__ rstd,
                                                   int64_t T, int64_t H, int64_t rows_per_chunk) {
  using P = Elements<E, K>;
  const int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * K;
  if (c >= H) return;
  const int64_t t0 = blockIdx.y * rows_per_chunk;
  const int64_t t1 = t0 + rows_per_chunk < T ? t0 + rows_per_chunk : T;
  double acc[K];
#pragma unroll
  for (int j = 0; j < K; ++j) acc[j] = 0.0;
  // Unrolled so that several rows' loads are in flight at once (the sums still add
  // row by row, in order): with 16-byte packs the kernel has few threads (about 128
  // blocks), each walking 32 rows, and one load at a time leaves it waiting on memory.
#pragma unroll 8
  for (int64_t t = t0; t < t1; ++t) {
    const float r = rstd[t];
    const P dyv = *reinterpret_cast<const P*>(dy + t * H + c), xv = *reinterpret_cast<const P*>(x + t * H + c);
#pragma unroll
    for (int j = 0; j < K; ++j)
      acc[j] += static_cast<double>(__fmul_rn(to_f32(dyv.v[j]), __fmul_rn(to_f32(xv.v[j]), r)));
  }
#pragma unroll
  for (int j = 0; j < K; ++j) partial[blockIdx.y * H + c + j] = acc[j];
}

// dw[c] += float(sum over chunks of partial[chunk, c]), chunks in order.
__global__ void rmsnorm_backward_dw_final_kernel(float* __restrict__ dw, const double* __restrict__ partial,
                                                 int64_t chunks, int64_t H) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < H;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
#pragma unroll 8
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
    with_pack<E>(H, {y.raw(), x.raw(), w.raw()}, [&](auto k) {
      rmsnorm_forward_kernel<E, decltype(k)::value><<<row_blocks(T), kRowThreads, 0, compute_stream()>>>(
          elements<E>(y), rstd.f32(), elements<E>(x), elements<E>(w), T, H, eps);
    });
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_forward");
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t T = x.dim(0), H = x.dim(1);
  if (T == 0 || H == 0) return;
  cudaStream_t stream = compute_stream();
  with_element_type(x.dtype, [&](auto e) {
    using E = decltype(e);
    with_pack<E>(H, {dx.raw(), dy.raw(), x.raw(), w.raw()}, [&](auto k) {
      rmsnorm_backward_dx_kernel<E, decltype(k)::value><<<row_blocks(T), kRowThreads, 0, stream>>>(
          elements<E>(dx), elements<E>(dy), elements<E>(x), elements<E>(w), rstd.f32(), T, H);
    });
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dx)");

  with_element_type(x.dtype, [&](auto e) {
    using E = decltype(e);
    with_pack<E>(H, {dy.raw(), x.raw()}, [&](auto k) {
      constexpr int K = decltype(k)::value;
      const int64_t col_tiles = (H / K + kColThreads - 1) / kColThreads;
      // K columns a thread: K times fewer blocks, the same chunks where H / 256 is a
      // multiple of K (and so the same dw to the bit).
      const int64_t target_blocks = kTargetBlocks / K;
      int64_t chunks = (target_blocks + col_tiles - 1) / col_tiles;
      if (chunks > T) chunks = T;
      if (chunks < 1) chunks = 1;
      const int64_t rows_per_chunk = (T + chunks - 1) / chunks;
      chunks = (T + rows_per_chunk - 1) / rows_per_chunk;  // no empty chunk
      double* partial = partials(static_cast<size_t>(chunks * H));
      const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks));
      rmsnorm_backward_dw_partial_kernel<E, K><<<grid, kColThreads, 0, stream>>>(partial, elements<E>(dy),
                                                                                elements<E>(x), rstd.f32(), T, H,
                                                                                rows_per_chunk);
      HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dw partials)");
      rmsnorm_backward_dw_final_kernel<<<blocks_for(H, kColThreads), kColThreads, 0, stream>>>(dw.f32(), partial,
                                                                                               chunks, H);
    });
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dw)");
}

}  // namespace hdp::cuda
