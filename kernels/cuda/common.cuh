#pragma once
// Shared by the CUDA backend's .cu files: error checks that name the op, the
// compute stream every op is enqueued on, grid sizing, warp/block reductions, and
// the fp32/bf16 element types the kernels are instantiated on.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/tensor.h"

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

// This GPU's most dynamic shared memory per block (what a kernel may use once it has
// opted in; without, 48 KB).
inline size_t max_shared_memory_per_block() {
  static const size_t bytes = [] {
    int device = 0, value = 0;
    HDP_CUDA_CHECK(cudaGetDevice(&device));
    HDP_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<size_t>(value);
  }();
  return bytes;
}

// Opts a kernel into all of it, once per kernel (the flag is per template instance).
template <auto Kernel>
void allow_max_shared_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    HDP_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(max_shared_memory_per_block())));
  });
}

// Grows a compute-stream scratch buffer to at least `bytes` (to 1.5 times its old
// capacity when that is more), stream-ordered: the old buffer is freed after the
// stream's earlier kernels that read it, the new one is usable by the stream's later
// ones. Not cudaFree, which waits for the whole device: mid-step that includes NCCL
// kernels waiting for peers that may wait for this rank's next collective, a hang (a
// scratch grows in the step that first sees a longer micro-batch, while gradient
// buckets are in flight).
// A device without stream-ordered allocation (cudaDevAttrMemoryPoolsSupported 0:
// some virtualised GPUs) gets the synchronising path: drain the stream, free, allocate.
inline void grow_stream_buffer(void** buffer, size_t* capacity, size_t bytes) {
  if (bytes <= *capacity) return;
  static const bool pools = [] {
    int device = 0, supported = 0;
    HDP_CUDA_CHECK(cudaGetDevice(&device));
    HDP_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
    return supported != 0;
  }();
  const size_t grown = std::max(bytes, *capacity + *capacity / 2);
  cudaStream_t stream = compute_stream();
  if (*buffer) {
    if (pools) {
      HDP_CUDA_CHECK(cudaFreeAsync(*buffer, stream));
    } else {
      HDP_CUDA_CHECK(cudaStreamSynchronize(stream));
      HDP_CUDA_CHECK(cudaFree(*buffer));
    }
    *buffer = nullptr;
    *capacity = 0;
  }
  if (pools) {
    HDP_CUDA_CHECK(cudaMallocAsync(buffer, grown, stream));
  } else {
    HDP_CUDA_CHECK(cudaMalloc(buffer, grown));
  }
  *capacity = grown;
}

// A device buffer that only grows, for an op's scratch on the compute stream: get()
// returns at least `bytes` (grow_stream_buffer). One per role (a function-local
// static); a caller whose uses could overlap (several threads) serializes them itself.
class DeviceScratch {
 public:
  void* get(size_t bytes) {
    std::lock_guard<std::mutex> lock(grow_);
    grow_stream_buffer(&buffer_, &capacity_, bytes);
    return buffer_;
  }
 private:
  std::mutex grow_;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
};

// ---- element types: fp32 and bf16 ----------------------------------------------
// The bf16 kernels are the fp32 kernels instantiated on the element type of the
// activations (E = float or __nv_bfloat16): they read bf16 exactly (widened to
// fp32), compute in fp32 and round once, to nearest even, where a bf16 result is
// stored (__float2bfloat16_rn, which is hdp::to_bf16: kernels/dtype.h) - the rule
// of the CPU bf16 twins (kernels/cpu/bf16.cpp) that the selftest holds them to.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class E>
__device__ __forceinline__ E from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// A tensor's device pointer as element type E (checks the tensor's dtype).
template <class E>
E* elements(const Tensor& t) {
  if constexpr (std::is_same_v<E, float>) {
    return t.f32();
  } else {
    static_assert(std::is_same_v<E, __nv_bfloat16>, "fp32 or bf16");
    return reinterpret_cast<__nv_bfloat16*>(t.bf16_data());
  }
}

// K consecutive elements that one thread loads or stores with one instruction. The
// memory-bound kernels take 16 bytes at a time (kPack<E>: 8 bf16 or 4 floats) where
// their rows and pointers allow: with one bf16 per thread too few bytes are in flight
// to reach HBM's bandwidth (an H200 ran SwiGLU's forward at about 1.3 TB/s of 4.3 so).
template <class E, int K>
struct alignas(sizeof(E) * K) Elements {
  E v[K];
};
template <class E>
inline constexpr int kPack = 16 / static_cast<int>(sizeof(E));

// Whether every pointer is 16-byte aligned (the packed loads' requirement).
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// The whole packs of K elements in n where every pointer is 16-byte aligned, else 0
// (an elementwise kernel then takes its first packs x K elements K at a time).
inline int64_t whole_packs(int64_t n, int k, std::initializer_list<const void*> pointers) {
  return aligned16(pointers) ? n / k : 0;
}

// Calls f(std::integral_constant<int, K>) with K = kPack<E> where n (a row's length)
// is a multiple of it and every pointer 16-byte aligned (rows then start aligned
// too), else K = 1: for kernels that take whole packs only.
template <class E, class F>
void with_pack(int64_t n, std::initializer_list<const void*> pointers, F&& f) {
  if (n % kPack<E> == 0 && aligned16(pointers))
    f(std::integral_constant<int, kPack<E>>{});
  else
    f(std::integral_constant<int, 1>{});
}

// Calls f(float{}) or f(__nv_bfloat16{}) for an fp32 or bf16 dtype: launchers
// instantiate their kernel on the activations' element type with it.
template <class F>
void with_element_type(DType dtype, F&& f) {
  if (dtype == DType::BF16)
    f(__nv_bfloat16{});
  else
    f(float{});
}

}  // namespace hdp::cuda
