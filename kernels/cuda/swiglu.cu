// SwiGLU on the GPU: out = silu(gate) * up with silu(g) = g / (1 + exp(-g)), and
// its backward (overwrites dgate and dup). Elementwise, memory-bound: grid-stride
// loops, one element per thread per step. exp is CUDA's expf (<= 2 ulp; the CPU
// uses its own ~1.4 ulp fast_expf, so the last bit or two may differ); the rest of
// each formula uses _rn intrinsics in the CPU's evaluation order, so nvcc does not
// contract it into FMAs (GCC may still contract the CPU's, hence last-bit differences).
// bf16 (E = __nv_bfloat16, common.cuh): inputs read widened, fp32 arithmetic, each
// result rounded once on store, as the CPU twin does.

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;

template <class E>
__global__ void swiglu_forward_kernel(E* __restrict__ out, const E* __restrict__ gate, const E* __restrict__ up,
                                      int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]);
    out[i] = from_f32<E>(__fmul_rn(g / __fadd_rn(1.0f, expf(-g)), to_f32(up[i])));
  }
}

// With s = sigmoid(g): dgate = dout * up * s * (1 + g * (1 - s)), dup = dout * g * s.
template <class E>
__global__ void swiglu_backward_kernel(E* __restrict__ dgate, E* __restrict__ dup, const E* __restrict__ dout,
                                       const E* __restrict__ gate, const E* __restrict__ up, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]), dy = to_f32(dout[i]);
    const float s = 1.0f / __fadd_rn(1.0f, expf(-g));
    const float silu = __fmul_rn(g, s);
    const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
    dup[i] = from_f32<E>(__fmul_rn(dy, silu));
    dgate[i] = from_f32<E>(__fmul_rn(__fmul_rn(dy, to_f32(up[i])), dsilu));
  }
}

}  // namespace

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel();
  if (n == 0) return;
  with_element_type(out.dtype, [&](auto e) {
    using E = decltype(e);
    swiglu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(elements<E>(out),
                                                                                       elements<E>(gate),
                                                                                       elements<E>(up), n);
  });
  HDP_CUDA_CHECK_LAUNCH("swiglu_forward");
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  with_element_type(gate.dtype, [&](auto e) {
    using E = decltype(e);
    swiglu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(
        elements<E>(dgate), elements<E>(dup), elements<E>(dout), elements<E>(gate), elements<E>(up), n);
  });
  HDP_CUDA_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace hdp::cuda
