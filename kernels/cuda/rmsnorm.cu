// RMSNorm as Hugging Face LlamaRMSNorm on the GPU: y = w * (x * rsqrt(mean(x^2) + eps)).
//
// Forward: one warp per row with the row in registers where it fits (up to 16 packs
// a lane: 4096 bf16 columns, 2048 fp32), else one block per row (grid-stride over
// rows); 16-byte packs of a row per thread where H allows. Backward: one block per chunk of rows, each row's dx as the
// forward's row, and dw's partial sums over the chunk from the same loads (below).
// The row statistics are accumulated in double (products of two floats are exact in
// double, so only the summation order differs from the CPU) and rstd is rounded to
// float once, as on the CPU. Elementwise float formulas use the _rn intrinsics in the
// CPU's evaluation order, so nvcc does not fuse them into FMAs (GCC may contract the
// CPU's dx update, so dx can differ in the last bit).
//
// dw sums over all T rows. To stay deterministic without atomics it is done in two
// steps: the rows are cut into fixed chunks, the backward's block for a chunk writes a
// double partial per column into a persistent device scratch [chunks, H], and a second
// kernel sums each column's partials in chunk order and adds them into dw. The
// chunking depends only on T, so results are the same on every run. (dw had a pass of
// its own over dy and x before; on an H200 the backward took 57 us a call at 4096 x
// 2048 bf16, where its bytes need about 20.)
//
// bf16 (E = __nv_bfloat16, common.cuh): x, w, y, dy and dx are bf16, read widened;
// the statistics, rstd and dw stay fp32 (double partials), and y and dx (the fp32
// sum dx + update) are rounded once on store, as the CPU twin does.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kColThreads = 256;
// The backward's row chunks: at least kMinChunkRows rows each (a chunk's dw partials,
// H doubles, stay small against its rows' bytes), at most kMaxChunks of them. Fixed
// numbers, so the chunking and dw's summation order depend on T alone.
constexpr int64_t kMinChunkRows = 8;
constexpr int64_t kMaxChunks = 1024;

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

// Rows of at most 32 x kLanePacks packs: one warp per row, each lane holding its
// packs (p = lane, lane + 32, ...) in registers from the one load to the store, the
// sum of squares reduced by shuffles. A block of kRowThreads takes 8 rows, so a
// thread has its whole share of a row in flight at once instead of one pack before a
// block-wide barrier (the block kernel above: 256 threads on a row of 256 packs, as
// bench-llama-1b's 2048 bf16 columns are).
template <class E, int K, int kLanePacks>
__global__ void rmsnorm_forward_warp_kernel(E* __restrict__ y, float* __restrict__ rstd, const E* __restrict__ x,
                                            const E* __restrict__ w, int64_t T, int64_t H, float eps) {
  using P = Elements<E, K>;
  const int64_t packs = H / K;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  const P* wp = reinterpret_cast<const P*>(w);
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5); t < T; t += warps) {
    const P* xr = reinterpret_cast<const P*>(x + t * H);
    P* yr = reinterpret_cast<P*>(y + t * H);
    P xv[kLanePacks];
    double acc = 0.0;
#pragma unroll
    for (int i = 0; i < kLanePacks; ++i) {
      const int64_t p = lane + 32 * i;
      if (p < packs) xv[i] = xr[p];
    }
#pragma unroll
    for (int i = 0; i < kLanePacks; ++i) {
      if (lane + 32 * i >= packs) continue;
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const double v = static_cast<double>(to_f32(xv[i].v[j]));
        acc += v * v;
      }
    }
    const double mean = warp_sum(acc) / static_cast<double>(H);
    const float r = static_cast<float>(1.0 / sqrt(mean + static_cast<double>(eps)));
    if (lane == 0) rstd[t] = r;
#pragma unroll
    for (int i = 0; i < kLanePacks; ++i) {
      const int64_t p = lane + 32 * i;
      if (p >= packs) continue;
      const P wv = wp[p];
      P yv;
#pragma unroll
      for (int j = 0; j < K; ++j) yv.v[j] = from_f32<E>(__fmul_rn(to_f32(wv.v[j]), __fmul_rn(to_f32(xv[i].v[j]), r)));
      yr[p] = yv;
    }
  }
}

// Block b takes rows [b R, (b + 1) R): per row dx += r * (w * dy) - c * x with
// c = r^3 * sum((w * dy) * x) / H, and for each column the double sum over its rows
// of dy * (x * r), kept in shared memory (each thread its own columns, [K][packs] so
// that neighbouring threads hit neighbouring banks) and written to partial[b, column]
// at the end: dw's partial sums from the loads dx needs anyway.
template <class E, int K>
__global__ void rmsnorm_backward_kernel(E* __restrict__ dx, double* __restrict__ partial, const E* __restrict__ dy,
                                        const E* __restrict__ x, const E* __restrict__ w,
                                        const float* __restrict__ rstd, int64_t T, int64_t H,
                                        int64_t rows_per_chunk) {
  using P = Elements<E, K>;
  extern __shared__ double shared_sums[];  // 32 for block_sum, then K x packs for dw
  double* reduce = shared_sums;
  double* dw_sums = shared_sums + 32;
  const int64_t packs = H / K;
  const P* wp = reinterpret_cast<const P*>(w);
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x)
#pragma unroll
    for (int j = 0; j < K; ++j) dw_sums[j * packs + p] = 0.0;
  const int64_t t0 = blockIdx.x * rows_per_chunk;
  const int64_t t1 = t0 + rows_per_chunk < T ? t0 + rows_per_chunk : T;
  for (int64_t t = t0; t < t1; ++t) {
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
    const double dot = block_sum(acc, reduce);
    const double rd = r;
    const float c = static_cast<float>(rd * rd * rd * dot / static_cast<double>(H));
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xv = xr[p], wv = wp[p], dyv = dyr[p];
      P dxv = dxr[p];
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const float xj = to_f32(xv.v[j]), dyj = to_f32(dyv.v[j]);
        const float g = __fmul_rn(to_f32(wv.v[j]), dyj);
        dxv.v[j] = from_f32<E>(__fadd_rn(to_f32(dxv.v[j]), __fsub_rn(__fmul_rn(r, g), __fmul_rn(c, xj))));
        dw_sums[j * packs + p] += static_cast<double>(__fmul_rn(dyj, __fmul_rn(xj, r)));
      }
      dxr[p] = dxv;
    }
  }
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x)
#pragma unroll
    for (int j = 0; j < K; ++j) partial[blockIdx.x * H + p * K + j] = dw_sums[j * packs + p];
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
      constexpr int K = decltype(k)::value;
      const int64_t lane_packs = (H / K + 31) / 32;
      constexpr int64_t kRowsPerBlock = kRowThreads / 32;
      const unsigned warp_blocks = row_blocks((T + kRowsPerBlock - 1) / kRowsPerBlock);
      cudaStream_t stream = compute_stream();
      if (lane_packs <= 8) {
        rmsnorm_forward_warp_kernel<E, K, 8><<<warp_blocks, kRowThreads, 0, stream>>>(
            elements<E>(y), rstd.f32(), elements<E>(x), elements<E>(w), T, H, eps);
      } else if (lane_packs <= 16) {
        rmsnorm_forward_warp_kernel<E, K, 16><<<warp_blocks, kRowThreads, 0, stream>>>(
            elements<E>(y), rstd.f32(), elements<E>(x), elements<E>(w), T, H, eps);
      } else {
        rmsnorm_forward_kernel<E, K><<<row_blocks(T), kRowThreads, 0, stream>>>(elements<E>(y), rstd.f32(),
                                                                               elements<E>(x), elements<E>(w), T, H,
                                                                               eps);
      }
    });
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_forward");
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t T = x.dim(0), H = x.dim(1);
  if (T == 0 || H == 0) return;
  cudaStream_t stream = compute_stream();
  const size_t smem = (32 + static_cast<size_t>(H)) * sizeof(double);
  if (smem > max_shared_memory_per_block())
    throw std::invalid_argument("rmsnorm_backward: a row of " + std::to_string(H) +
                                " columns needs " + std::to_string(smem) +
                                " bytes of shared memory for its weight-gradient sums, more than this GPU's " +
                                std::to_string(max_shared_memory_per_block()));
  const int64_t rows_per_chunk = std::max(kMinChunkRows, (T + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (T + rows_per_chunk - 1) / rows_per_chunk;
  double* partial = partials(static_cast<size_t>(chunks * H));
  with_element_type(x.dtype, [&](auto e) {
    using E = decltype(e);
    with_pack<E>(H, {dx.raw(), dy.raw(), x.raw(), w.raw()}, [&](auto k) {
      constexpr auto kernel = rmsnorm_backward_kernel<E, decltype(k)::value>;
      allow_max_shared_memory<kernel>();
      kernel<<<static_cast<unsigned>(chunks), kRowThreads, smem, stream>>>(
          elements<E>(dx), partial, elements<E>(dy), elements<E>(x), elements<E>(w), rstd.f32(), T, H,
          rows_per_chunk);
    });
  });
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dx and dw partials)");
  rmsnorm_backward_dw_final_kernel<<<blocks_for(H, kColThreads), kColThreads, 0, stream>>>(dw.f32(), partial, chunks,
                                                                                           H);
  HDP_CUDA_CHECK_LAUNCH("rmsnorm_backward (dw)");
}

}  // namespace hdp::cuda
