// Elementwise ops, copies and the sum of squares on the GPU.
//
// add/scale/fill are memory-bound grid-stride loops (coalesced; 16 bytes a thread
// where the kernel says so); fill with zero is a cudaMemsetAsync. copy is a
// cudaMemcpyAsync with cudaMemcpyDefault so either side may be host or device
// memory; when one side is on the host the stream is synchronized before returning,
// so the caller may read/reuse the host buffer
// (copy_index_async does not wait: its host side is pinned and kept by the caller).
// sum_squares accumulates in double and reduces in two fixed stages (per-block
// partials into a static device array, then one block), so for a given n the
// summation order, and hence the result, is the same on every run.
// The sums on the device (fp64, kernels/ops.h) are added into by one block: a
// sum_squares into one adds its stage-2 result, and read_back is the one copy out.
//
// add, scale, fill and copy also take bf16 tensors (fp32 arithmetic, one rounding
// on store, as the CPU twins in kernels/cpu/bf16.cpp); a copy between fp32 and bf16
// is a conversion kernel on device memory (through a device image of the host side
// when one side is host memory).

#include <cuda_bf16.h>

#include <bit>
#include <cstdint>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSumBlocks = 1024;  // stage-1 blocks at most; stage 2 is one block of this many threads

__device__ double g_sum_partials[kSumBlocks];
__device__ double g_sum_result;

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void scale_kernel(float* __restrict__ y, float s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] *= s;
}

__global__ void fill_kernel(float* __restrict__ y, float value, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = value;
}


// bf16 twins (kernels/cpu/bf16.cpp is their reference): fp32 arithmetic, one
// round-to-nearest-even (__float2bfloat16_rn, as hdp::to_bf16) on store.
// The residual adds and the rounding of the master weights into their bf16 copy run
// on every layer or step: 16-byte packs of bf16 (common.cuh: Elements) for the first
// `packs` x 8 elements where the pointers allow, then one by one.
__global__ void add_bf16_kernel(__nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ x, int64_t n,
                                int64_t packs) {
  using P = Elements<__nv_bfloat16, 8>;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    P yv = reinterpret_cast<P*>(y)[p];
    const P xv = reinterpret_cast<const P*>(x)[p];
#pragma unroll
    for (int j = 0; j < 8; ++j) yv.v[j] = __float2bfloat16_rn(__bfloat162float(yv.v[j]) + __bfloat162float(xv.v[j]));
    reinterpret_cast<P*>(y)[p] = yv;
  }
  for (int64_t i = packs * 8 + first; i < n; i += stride)
    y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + __bfloat162float(x[i]));
}

__global__ void scale_bf16_kernel(__nv_bfloat16* __restrict__ y, float s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) * s);
}

__global__ void fill_bf16_kernel(__nv_bfloat16* __restrict__ y, float value, int64_t n) {
  const __nv_bfloat16 v = __float2bfloat16_rn(value);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = v;
}

__global__ void round_to_bf16_kernel(__nv_bfloat16* __restrict__ y, const float* __restrict__ x, int64_t n,
                                     int64_t packs) {
  using In = Elements<float, 4>;
  using Out = Elements<__nv_bfloat16, 4>;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    const In xv = reinterpret_cast<const In*>(x)[p];
    Out yv;
#pragma unroll
    for (int j = 0; j < 4; ++j) yv.v[j] = __float2bfloat16_rn(xv.v[j]);
    reinterpret_cast<Out*>(y)[p] = yv;
  }
  for (int64_t i = packs * 4 + first; i < n; i += stride) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void widen_bf16_kernel(float* __restrict__ y, const __nv_bfloat16* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

// Stage 1: block b writes the double sum of squares of its grid-stride share.
// The first `packs` x 4 elements 4 at a time (16-byte loads: the gradient norm reads
// every gradient once a step, 3.6 GB in bench-llama-1b), then the rest one by one.
__global__ void sum_squares_partial_kernel(const float* __restrict__ x, int64_t n, int64_t packs) {
  using P = Elements<float, 4>;
  __shared__ double shared[32];
  double acc = 0.0;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    const P v = reinterpret_cast<const P*>(x)[p];
#pragma unroll
    for (int j = 0; j < 4; ++j) acc += static_cast<double>(v.v[j]) * static_cast<double>(v.v[j]);
  }
  for (int64_t i = packs * 4 + first; i < n; i += stride) {
    const double v = static_cast<double>(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) g_sum_partials[blockIdx.x] = acc;
}

// Stage 2: one block sums the `parts` partials into *out (overwritten), or adds that
// sum into it when `accumulate` (a sum on the device, kernels/ops.h).
__global__ void sum_squares_final_kernel(int parts, double* out, bool accumulate) {
  __shared__ double shared[32];
  double v = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) v += g_sum_partials[i];
  v = block_sum(v, shared);
  if (threadIdx.x == 0) *out = accumulate ? __dadd_rn(*out, v) : v;
}

// Sums on the device: a handful of elements, so one block of one warp.
__global__ void fill_double_kernel(double* __restrict__ y, double value, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = value;
}

__global__ void add_double_kernel(double* __restrict__ y, const double* __restrict__ x, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = __dadd_rn(y[i], x[i]);
}

__global__ void add_scalar_double_kernel(double* __restrict__ y, double value) { y[0] = __dadd_rn(y[0], value); }

void copy_bytes(void* dst, const void* src, size_t bytes, bool host_side) {
  cudaStream_t stream = compute_stream();
  HDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  if (host_side) HDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

void add_inplace(Tensor y, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  if (y.dtype == DType::BF16) {
    const int64_t packs = whole_packs(n, 8, {y.raw(), x.raw()});
    add_bf16_kernel<<<blocks_for(packs > 0 ? packs : n, kThreads), kThreads, 0, compute_stream()>>>(
        elements<__nv_bfloat16>(y), elements<__nv_bfloat16>(x), n, packs);
    HDP_CUDA_CHECK_LAUNCH("add_inplace (bf16)");
    return;
  }
  add_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(y.data, x.data, n);
  HDP_CUDA_CHECK_LAUNCH("add_inplace");
}

void scale_inplace(Tensor y, float s) {
  const int64_t n = y.numel();
  if (n == 0) return;
  if (y.dtype == DType::BF16) {
    scale_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(elements<__nv_bfloat16>(y), s, n);
    HDP_CUDA_CHECK_LAUNCH("scale_inplace (bf16)");
    return;
  }
  scale_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(y.data, s, n);
  HDP_CUDA_CHECK_LAUNCH("scale_inplace");
}

void fill(Tensor y, float value) {
  const int64_t n = y.numel();
  if (n == 0) return;
  // Zero, in fp32 or bf16, is all-zero bytes: a memset, which writes at the copy
  // rate (the gradients are zeroed every step, 3.6 GB in bench-llama-1b).
  if (std::bit_cast<uint32_t>(value) == 0) {
    HDP_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.bytes(), compute_stream()));
    return;
  }
  if (y.dtype == DType::BF16) {
    fill_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(elements<__nv_bfloat16>(y), value, n);
    HDP_CUDA_CHECK_LAUNCH("fill (bf16)");
    return;
  }
  fill_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(y.data, value, n);
  HDP_CUDA_CHECK_LAUNCH("fill");
}

void copy(Tensor dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0 || dst.data == src.data) return;
  if (dst.dtype == src.dtype) {
    copy_bytes(dst.data, src.data, dst.bytes(), dst.device == Device::CPU || src.device == Device::CPU);
    return;
  }
  // A conversion runs as a kernel on device memory. With one side on the host
  // (a communicator staging bf16 device tensors through fp32 host blocks), the
  // device side is converted through a device image of the host side's dtype.
  const bool host_side = dst.device == Device::CPU || src.device == Device::CPU;
  static DeviceScratch images;
  static std::mutex image_use;  // copies may come from several threads
  std::unique_lock<std::mutex> lock(image_use, std::defer_lock);
  Tensor from = src, to = dst;
  if (host_side) {
    lock.lock();
    Tensor& device_image = src.device == Device::CPU ? from : to;
    device_image.data = static_cast<float*>(images.get(device_image.bytes()));
    device_image.device = Device::CUDA;
    if (src.device == Device::CPU) copy_bytes(from.data, src.data, src.bytes(), false);
  }
  cudaStream_t stream = compute_stream();
  if (to.dtype == DType::BF16) {
    // 4 floats in (16 bytes), 4 bf16 out (8 bytes).
    const int64_t packs = whole_packs(n, 4, {to.raw(), from.raw()});
    round_to_bf16_kernel<<<blocks_for(packs > 0 ? packs : n, kThreads), kThreads, 0, stream>>>(
        elements<__nv_bfloat16>(to), from.f32(), n, packs);
  } else {
    widen_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(to.f32(), elements<__nv_bfloat16>(from), n);
  }
  HDP_CUDA_CHECK_LAUNCH("copy (fp32 <-> bf16)");
  if (host_side) {
    if (dst.device == Device::CPU) copy_bytes(dst.data, to.data, dst.bytes(), false);
    HDP_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host buffer and the image are free again
  }
}

void copy_index(IndexTensor dst, const IndexTensor& src) {
  const int64_t n = dst.numel();
  if (n == 0 || dst.data == src.data) return;
  copy_bytes(dst.data, src.data, dst.bytes(), dst.device == Device::CPU || src.device == Device::CPU);
}

void copy_index_async(IndexTensor dst, const IndexTensor& src) {
  if (dst.numel() > 0) copy_bytes(dst.data, src.data, dst.bytes(), false);
}

namespace {
// Enqueues the sum of squares of x (not empty) into *out, overwriting it or adding into it.
void enqueue_sum_squares(const Tensor& x, double* out, bool accumulate) {
  const int64_t n = x.numel();
  cudaStream_t stream = compute_stream();
  const int64_t packs = whole_packs(n, 4, {x.raw()});
  const unsigned wanted = blocks_for(packs > 0 ? packs : n, kThreads);
  const unsigned blocks = wanted < kSumBlocks ? wanted : kSumBlocks;
  sum_squares_partial_kernel<<<blocks, kThreads, 0, stream>>>(x.data, n, packs);
  HDP_CUDA_CHECK_LAUNCH("sum_squares (partials)");
  sum_squares_final_kernel<<<1, kSumBlocks, 0, stream>>>(static_cast<int>(blocks), out, accumulate);
  HDP_CUDA_CHECK_LAUNCH("sum_squares (final)");
}
}  // namespace

double sum_squares(const Tensor& x) {
  if (x.numel() == 0) return 0.0;
  void* result_address = nullptr;
  HDP_CUDA_CHECK(cudaGetSymbolAddress(&result_address, g_sum_result));
  enqueue_sum_squares(x, static_cast<double*>(result_address), false);
  double result = 0.0;
  cudaStream_t stream = compute_stream();
  HDP_CUDA_CHECK(cudaMemcpyFromSymbolAsync(&result, g_sum_result, sizeof(double), 0, cudaMemcpyDeviceToHost, stream));
  HDP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

void sum_squares(const Tensor& x, DoubleTensor sum) {
  if (x.numel() > 0) enqueue_sum_squares(x, sum.data, true);
}

void fill(DoubleTensor y, double value) {
  if (y.numel() == 0) return;
  fill_double_kernel<<<1, 32, 0, compute_stream()>>>(y.data, value, y.numel());
  HDP_CUDA_CHECK_LAUNCH("fill (fp64)");
}

void add_inplace(DoubleTensor y, const DoubleTensor& x) {
  if (y.numel() == 0) return;
  add_double_kernel<<<1, 32, 0, compute_stream()>>>(y.data, x.data, y.numel());
  HDP_CUDA_CHECK_LAUNCH("add_inplace (fp64)");
}

void add_scalar(DoubleTensor y, double value) {
  add_scalar_double_kernel<<<1, 1, 0, compute_stream()>>>(y.data, value);
  HDP_CUDA_CHECK_LAUNCH("add_scalar (fp64)");
}

void read_back(const DoubleTensor& x, std::span<double> out) {
  if (!out.empty()) copy_bytes(out.data(), x.data, x.bytes(), true);
}

}  // namespace hdp::cuda
