// SwiGLU on the GPU: out = silu(gate) * up with silu(g) = g / (1 + exp(-g)), and
// its backward (overwrites dgate and dup). Elementwise, memory-bound: grid-stride
// loops, one element per thread per step. exp is CUDA's expf (<= 2 ulp; the CPU
// uses its own ~1.4 ulp fast_expf, so the last bit or two may differ); the rest of
// each formula uses _rn intrinsics in the CPU's evaluation order, so nvcc does not
// contract it into FMAs (GCC may still contract the CPU's, hence last-bit differences).

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void swiglu_forward_kernel(float* __restrict__ out, const float* __restrict__ gate,
                                      const float* __restrict__ up, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = __fmul_rn(g / __fadd_rn(1.0f, expf(-g)), up[i]);
  }
}

// With s = sigmoid(g): dgate = dout * up * s * (1 + g * (1 - s)), dup = dout * g * s.
__global__ void swiglu_backward_kernel(float* __restrict__ dgate, float* __restrict__ dup,
                                       const float* __restrict__ dout, const float* __restrict__ gate,
                                       const float* __restrict__ up, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i], dy = dout[i];
    const float s = 1.0f / __fadd_rn(1.0f, expf(-g));
    const float silu = __fmul_rn(g, s);
    const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
    dup[i] = __fmul_rn(dy, silu);
    dgate[i] = __fmul_rn(__fmul_rn(dy, up[i]), dsilu);
  }
}

}  // namespace

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel();
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(out.data, gate.data, up.data, n);
  HDP_CUDA_CHECK_LAUNCH("swiglu_forward");
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(dgate.data, dup.data, dout.data,
                                                                                      gate.data, up.data, n);
  HDP_CUDA_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace hdp::cuda
