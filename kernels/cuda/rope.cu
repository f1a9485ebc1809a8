// Rotary position embedding on the GPU, rotate-half pairing as in Hugging Face
// LLaMA: element j pairs with j + d/2, angle = float(pos) * inv_freq_j.
//
// inv_freq is computed on the host by RopeSettings::inverse_frequencies (spec/rope.h),
// as the CPU backend computes it, so it is bit-identical to the CPU's:
// this matters, because at positions ~1e5 one ulp of inv_freq (device powf may
// differ by one) moves the angle by ~1e-2 rad. The table travels in the kernel's
// parameters (d/2 <= kMaxHalf, every real head size); larger ones go through a
// persistent device buffer (a small host-to-device copy per call).
// One block per token (grid-stride): the block first computes cos/sin of its
// token's d/2 angles (float32 sincosf) into shared memory, then rotates every head
// of the token with them (the query's and the key's heads in one call where both
// are given), threads running along contiguous elements of the row (16
// bytes of each half a thread where d/2 and the address allow).
// The rotation uses _rn intrinsics in the CPU's evaluation order (no FMA
// contraction by nvcc; a CPU build with FMA may still differ in the last bit).
// bf16 (E = __nv_bfloat16, common.cuh): each pair is read widened, rotated in fp32
// and rounded once on store, as the CPU twin does.

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace hdp::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHalf = 512;  // 2 KiB of kernel parameters

struct InvFreq {
  float v[kMaxHalf];
};

// inv_freq for d/2 > kMaxHalf; grows only when a larger table is needed.
float* g_inv_freq = nullptr;
size_t g_inv_freq_bytes = 0;

// K pairs a thread at once: 16-byte packs of the low and high halves where d / 2 is
// a multiple of K and x (and x2) are aligned (the same formula per pair), else K = 1.
// A token's heads of x, then its heads2 heads of x2 (none without x2), share its
// cos and sin.
template <class E, int K>
__global__ void rope_kernel(E* __restrict__ x, E* __restrict__ x2, const int32_t* __restrict__ positions, int64_t T,
                            int64_t heads, int64_t heads2, int64_t d, float sign,
                            const __grid_constant__ InvFreq inv_freq, const float* __restrict__ inv_freq_buffer) {
  using P = Elements<E, K>;
  extern __shared__ float cs_sn[];  // cos [half] then sign * sin [half]
  const int64_t half = d / 2;
  float* cs = cs_sn;
  float* sn = cs_sn + half;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float pos = static_cast<float>(positions[t]);
    __syncthreads();  // the previous token's rotation has finished reading cs/sn
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      const float f = inv_freq_buffer ? inv_freq_buffer[j] : inv_freq.v[j];
      float s, c;
      sincosf(pos * f, &s, &c);
      cs[j] = c;
      sn[j] = sign * s;
    }
    __syncthreads();
    E* row = x + t * heads * d;
    E* row2 = x2 + t * heads2 * d;  // unused without x2 (heads2 = 0)
    for (int64_t idx = threadIdx.x; idx < (heads + heads2) * half / K; idx += blockDim.x) {
      const int64_t h = idx * K / half, j0 = idx * K - h * half;
      E* head = h < heads ? row + h * d : row2 + (h - heads) * d;
      P* lo = reinterpret_cast<P*>(head + j0);
      P* hi = reinterpret_cast<P*>(head + j0 + half);
      P a = *lo, b = *hi;
#pragma unroll
      for (int q = 0; q < K; ++q) {
        const float x1 = to_f32(a.v[q]), x2 = to_f32(b.v[q]), c = cs[j0 + q], sv = sn[j0 + q];
        a.v[q] = from_f32<E>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sv)));
        b.v[q] = from_f32<E>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sv)));
      }
      *lo = a;
      *hi = b;
    }
  }
}

void rope_rotate(Tensor x, Tensor x2, const IndexTensor& positions, const RopeSettings& rope, bool inverse,
                 const char* op) {
  const int64_t T = x.dim(0), heads = x.dim(1), heads2 = x2.data ? x2.dim(1) : 0, d = x.dim(2), half = d / 2;
  if (T == 0 || heads + heads2 == 0 || half == 0) return;
  cudaStream_t stream = compute_stream();
  const std::vector<float> table = rope.inverse_frequencies(d);
  InvFreq inv_freq{};
  const float* buffer = nullptr;
  if (half <= kMaxHalf) {
    for (int64_t j = 0; j < half; ++j) inv_freq.v[j] = table[j];
  } else {
    grow_stream_buffer(reinterpret_cast<void**>(&g_inv_freq), &g_inv_freq_bytes, static_cast<size_t>(half) * sizeof(float));
    // Stream-ordered after earlier kernels that read the buffer; a pageable source
    // is staged before the call returns, so `table` may be rewritten at once.
    HDP_CUDA_CHECK(cudaMemcpyAsync(g_inv_freq, table.data(), static_cast<size_t>(half) * sizeof(float),
                                   cudaMemcpyHostToDevice, stream));
    buffer = g_inv_freq;
  }
  const unsigned blocks = static_cast<unsigned>(T < (1 << 20) ? T : (1 << 20));
  const size_t shared = 2 * static_cast<size_t>(half) * sizeof(float);
  with_element_type(x.dtype, [&](auto e) {
    using E = decltype(e);
    E* second = x2.data ? elements<E>(x2) : nullptr;
    with_pack<E>(half, {x.raw(), x2.data ? x2.raw() : x.raw()}, [&](auto k) {
      rope_kernel<E, decltype(k)::value><<<blocks, kThreads, shared, stream>>>(
          elements<E>(x), second, positions.data, T, heads, heads2, d, inverse ? -1.0f : 1.0f, inv_freq, buffer);
    });
  });
  HDP_CUDA_CHECK_LAUNCH(op);
}

}  // namespace

void rope_forward(Tensor x, const IndexTensor& positions, const RopeSettings& rope, Tensor x2) {
  rope_rotate(x, x2, positions, rope, false, "rope_forward");
}

void rope_backward(Tensor dx, const IndexTensor& positions, const RopeSettings& rope, Tensor dx2) {
  rope_rotate(dx, dx2, positions, rope, true, "rope_backward");
}

}  // namespace hdp::cuda
