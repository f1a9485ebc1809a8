// AdamW on the GPU, the same update as the CPU backend (torch.optim.AdamW's
// single-tensor path):
//   g = grad * grad_scale;  param *= 1 - lr * wd
//   m.lerp_(g, 1 - beta1);  v = v * beta2 + (1 - beta2) * g * g
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// The scalars are formed on the host in double and rounded to float once, exactly
// as the CPU does, and passed by value as kernel arguments (nothing to copy or
// keep alive). Elementwise math is float, 16 bytes of each array per thread per
// step of a grid-stride loop where the pointers allow, with _rn intrinsics in the CPU's evaluation order so nvcc does
// not contract it into FMAs; division and sqrtf are IEEE (no fast-math). GCC with
// -march=native may contract the CPU's formulas, so results can differ in the last
// bit (about 1e-7 relative) from the CPU backend. With a bf16 copy of the parameters,
// each updated value is also rounded into it (__float2bfloat16_rn, as copy rounds).

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 256;

struct AdamWScalars {
  float decay;          // 1 - lr * weight_decay
  float w1;             // lerp weight 1 - beta1
  float one_minus_w1;   // 1 - w1 (in float, as the CPU's 1.0f - w1)
  float beta2;
  float one_minus_b2;
  float step_size;      // lr / (1 - beta1^step)
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float eps;
  float grad_scale;
  bool lerp_low;        // w1 < 0.5: torch's lerp formula choice
};

__device__ __forceinline__ void adamw_element(float& p, float gr, float& mm, float& vv, const AdamWScalars& s) {
  const float g = __fmul_rn(gr, s.grad_scale);
  const float pi = __fmul_rn(p, s.decay);
  const float m0 = mm;
  const float diff = __fsub_rn(g, m0);
  const float mi = s.lerp_low ? __fadd_rn(m0, __fmul_rn(s.w1, diff)) : __fsub_rn(g, __fmul_rn(diff, s.one_minus_w1));
  const float vi = __fadd_rn(__fmul_rn(vv, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
  const float denom = __fadd_rn(sqrtf(vi) / s.bc2_sqrt, s.eps);
  mm = mi;
  vv = vi;
  p = __fsub_rn(pi, __fmul_rn(s.step_size, mi / denom));
}

// The first `packs` x 4 elements 4 at a time (16-byte loads of each array), then the
// rest one by one: the same update either way. kWithBf16: pb (else unused) receives
// each updated parameter rounded to bf16.
template <bool kWithBf16>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ gr, float* __restrict__ mm,
                             float* __restrict__ vv, __nv_bfloat16* __restrict__ pb, int64_t n, int64_t packs,
                             AdamWScalars s) {
  using P = Elements<float, 4>;
  using B = Elements<__nv_bfloat16, 4>;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < packs; i += stride) {
    P pv = reinterpret_cast<P*>(p)[i], mv = reinterpret_cast<P*>(mm)[i], vvv = reinterpret_cast<P*>(vv)[i];
    const P gv = reinterpret_cast<const P*>(gr)[i];
#pragma unroll
    for (int j = 0; j < 4; ++j) adamw_element(pv.v[j], gv.v[j], mv.v[j], vvv.v[j], s);
    reinterpret_cast<P*>(p)[i] = pv;
    reinterpret_cast<P*>(mm)[i] = mv;
    reinterpret_cast<P*>(vv)[i] = vvv;
    if constexpr (kWithBf16) {
      B bv;
#pragma unroll
      for (int j = 0; j < 4; ++j) bv.v[j] = __float2bfloat16_rn(pv.v[j]);
      reinterpret_cast<B*>(pb)[i] = bv;
    }
  }
  for (int64_t i = packs * 4 + first; i < n; i += stride) {
    adamw_element(p[i], gr[i], mm[i], vv[i], s);
    if constexpr (kWithBf16) pb[i] = __float2bfloat16_rn(p[i]);
  }
}

}  // namespace

void adamw_update(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWStep& st, Tensor param_bf16) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const double lr = st.lr, b1 = st.beta1, b2 = st.beta2;
  const double step = static_cast<double>(st.step);
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - lr * static_cast<double>(st.weight_decay));
  s.w1 = static_cast<float>(1.0 - b1);
  s.one_minus_w1 = 1.0f - s.w1;
  s.beta2 = st.beta2;
  s.one_minus_b2 = static_cast<float>(1.0 - b2);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(b1, step)));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, step)));
  s.eps = st.eps;
  s.grad_scale = st.grad_scale;
  s.lerp_low = s.w1 < 0.5f;
  // The bf16 copy's packs of 4 are 8 bytes: aligned to them where its element offset
  // is a multiple of 4, which 16-byte alignment of the fp32 side does not imply.
  const bool bf16_packs = !param_bf16.data || reinterpret_cast<uintptr_t>(param_bf16.raw()) % 8 == 0;
  const int64_t packs = bf16_packs ? whole_packs(n, 4, {param.raw(), grad.raw(), m.raw(), v.raw()}) : 0;
  const unsigned blocks = blocks_for(packs > 0 ? packs : n, kThreads);
  if (param_bf16.data) {
    adamw_kernel<true><<<blocks, kThreads, 0, compute_stream()>>>(param.data, grad.data, m.data, v.data,
                                                                  elements<__nv_bfloat16>(param_bf16), n, packs, s);
  } else {
    adamw_kernel<false><<<blocks, kThreads, 0, compute_stream()>>>(param.data, grad.data, m.data, v.data, nullptr, n,
                                                                   packs, s);
  }
  HDP_CUDA_CHECK_LAUNCH("adamw_update");
}

}  // namespace hdp::cuda
