// SwiGLU on the GPU: out = silu(gate) * up with silu(g) = g / (1 + exp(-g)), and
// its backward (overwrites dgate and dup; given `out`, also writes the forward's
// output, which the MLP's backward recomputes instead of keeping: gate and up are
// then read once). Elementwise, memory-bound: grid-stride loops over 16-byte packs of
// elements where the operands are aligned to them (common.cuh: Elements), then
// element by element; the same formula either way. exp is CUDA's expf (<= 2 ulp; the
// CPU uses its own ~1.4 ulp fast_expf, so the last bit or two may differ); the rest of
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

// The forward's value from g and 1 + exp(-g).
__device__ __forceinline__ float swiglu_of(float g, float denominator, float up) {
  return __fmul_rn(g / denominator, up);
}

template <class E>
__device__ __forceinline__ E swiglu_value(E gate, E up) {
  const float g = to_f32(gate);
  return from_f32<E>(swiglu_of(g, __fadd_rn(1.0f, expf(-g)), to_f32(up)));
}

// With s = sigmoid(g): dgate = dout * up * s * (1 + g * (1 - s)), dup = dout * g * s.
// kWithOut: also the forward's value into *out, as swiglu_value computes it.
template <bool kWithOut, class E>
__device__ __forceinline__ void swiglu_gradients(E& dgate, E& dup, E* out, E dout, E gate, E up) {
  const float g = to_f32(gate), dy = to_f32(dout), u = to_f32(up);
  const float denominator = __fadd_rn(1.0f, expf(-g));
  if constexpr (kWithOut) *out = from_f32<E>(swiglu_of(g, denominator, u));
  const float s = 1.0f / denominator;
  const float silu = __fmul_rn(g, s);
  const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
  dup = from_f32<E>(__fmul_rn(dy, silu));
  dgate = from_f32<E>(__fmul_rn(__fmul_rn(dy, u), dsilu));
}

// The first `packs` x K elements K at a time (16-byte loads), the rest one by one.
template <class E, int K>
__global__ void swiglu_forward_kernel(E* __restrict__ out, const E* __restrict__ gate, const E* __restrict__ up,
                                      int64_t n, int64_t packs) {
  using P = Elements<E, K>;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    const P g = reinterpret_cast<const P*>(gate)[p], u = reinterpret_cast<const P*>(up)[p];
    P o;
#pragma unroll
    for (int j = 0; j < K; ++j) o.v[j] = swiglu_value(g.v[j], u.v[j]);
    reinterpret_cast<P*>(out)[p] = o;
  }
  for (int64_t i = packs * K + first; i < n; i += stride) out[i] = swiglu_value(gate[i], up[i]);
}

// kWithOut: out (else unused) also receives the forward's output.
template <class E, int K, bool kWithOut>
__global__ void swiglu_backward_kernel(E* __restrict__ dgate, E* __restrict__ dup, E* __restrict__ out,
                                       const E* __restrict__ dout, const E* __restrict__ gate,
                                       const E* __restrict__ up, int64_t n, int64_t packs) {
  using P = Elements<E, K>;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += stride) {
    const P dy = reinterpret_cast<const P*>(dout)[p], g = reinterpret_cast<const P*>(gate)[p],
            u = reinterpret_cast<const P*>(up)[p];
    P dg, du, o;
#pragma unroll
    for (int j = 0; j < K; ++j) swiglu_gradients<kWithOut>(dg.v[j], du.v[j], &o.v[j], dy.v[j], g.v[j], u.v[j]);
    reinterpret_cast<P*>(dgate)[p] = dg;
    reinterpret_cast<P*>(dup)[p] = du;
    if constexpr (kWithOut) reinterpret_cast<P*>(out)[p] = o;
  }
  for (int64_t i = packs * K + first; i < n; i += stride)
    swiglu_gradients<kWithOut>(dgate[i], dup[i], kWithOut ? &out[i] : nullptr, dout[i], gate[i], up[i]);
}

}  // namespace

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel();
  if (n == 0) return;
  with_element_type(out.dtype, [&](auto e) {
    using E = decltype(e);
    constexpr int K = kPack<E>;
    const int64_t packs = whole_packs(n, K, {out.raw(), gate.raw(), up.raw()});
    swiglu_forward_kernel<E, K><<<blocks_for(packs > 0 ? packs : n, kThreads), kThreads, 0, compute_stream()>>>(
        elements<E>(out), elements<E>(gate), elements<E>(up), n, packs);
  });
  HDP_CUDA_CHECK_LAUNCH("swiglu_forward");
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor out) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  with_element_type(gate.dtype, [&](auto e) {
    using E = decltype(e);
    constexpr int K = kPack<E>;
    const int64_t packs =
        whole_packs(n, K, {dgate.raw(), dup.raw(), dout.raw(), gate.raw(), up.raw(), out.data ? out.raw() : dup.raw()});
    const unsigned blocks = blocks_for(packs > 0 ? packs : n, kThreads);
    cudaStream_t stream = compute_stream();
    if (out.data) {
      swiglu_backward_kernel<E, K, true><<<blocks, kThreads, 0, stream>>>(
          elements<E>(dgate), elements<E>(dup), elements<E>(out), elements<E>(dout), elements<E>(gate),
          elements<E>(up), n, packs);
    } else {
      swiglu_backward_kernel<E, K, false><<<blocks, kThreads, 0, stream>>>(
          elements<E>(dgate), elements<E>(dup), nullptr, elements<E>(dout), elements<E>(gate), elements<E>(up), n,
          packs);
    }
  });
  HDP_CUDA_CHECK_LAUNCH("swiglu_backward");
}

}  // namespace hdp::cuda
