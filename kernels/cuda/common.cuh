#pragma once
// Shared by the CUDA backend's .cu files: error checks that name the op, the
// compute stream every op is enqueued on, grid sizing, and warp/block reductions.

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace hdp::cuda {

// The stream all ops of this process run on (created by initialize()).
cudaStream_t compute_stream();

[[noreturn]] void throw_cuda_error(const char* what, cudaError_t err, const char* file, int line);

// Checks a CUDA runtime call.
#define HDP_CUDA_CHECK(call)                                                                \
  do {                                                                                      \
    cudaError_t hdp_err_ = (call);                                                          \
    if (hdp_err_ != cudaSuccess) ::hdp::cuda::throw_cuda_error(#call, hdp_err_, __FILE__, __LINE__); \
  } while (0)

// Checks the launch just made; `op` names the op in the message.
#define HDP_CUDA_CHECK_LAUNCH(op)                                                           \
  do {                                                                                      \
    cudaError_t hdp_err_ = cudaGetLastError();                                              \
    if (hdp_err_ != cudaSuccess) ::hdp::cuda::throw_cuda_error(op, hdp_err_, __FILE__, __LINE__); \
  } while (0)

// Blocks of `threads` to cover n elements, capped so the grid-stride loops stay
// within the launch limits.
inline unsigned blocks_for(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;
  return static_cast<unsigned>(b);
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024) in float or
// double; every thread gets the result. `shared` holds 32 values.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace hdp::cuda
