// SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g) = g / (1 + exp(-g))
// (torch computes silu as x / (1 + exp(-x))). exp is simd::exp (fast_math.h).
//
// The loops run on explicit vectors (simd.h): GCC does not vectorise fast_expf's
// range tests in a plain loop, and the scalar loops were 3% of a bench-llama step.
// A range's last partial vector goes through the same vector code on a zero-padded
// copy, so every element is computed by one sequence of operations (no scalar
// variant that the compiler could contract into FMAs differently), whatever its
// place in the tensor. The file is compiled with -ffp-contract=off
// (kernels/CMakeLists.txt), so the vector code rounds every product and sum as
// written, exactly as the scalar loop it replaced did.

#include <omp.h>

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/simd.h"

namespace hdp::cpu {
namespace {

using namespace simd;

constexpr int64_t kParallelMin = 1 << 14;
// Elements per OpenMP work item: whole vectors, so only the last item has a partial vector.
constexpr int64_t kChunk = 1 << 12;

// Applies `body(offset, pointers...)` to [begin, end) in whole vectors; the last
// partial vector runs on zero-padded copies of the inputs, and its outputs are copied back.
template <int kIn, int kOut, class Body>
void vector_range(const float* const (&in)[kIn], float* const (&out)[kOut], int64_t begin, int64_t end, Body body) {
  int64_t i = begin;
  for (; i + kW <= end; i += kW) body(in, out, i);
  if (i == end) return;
  const int64_t rest = end - i;
  alignas(64) float in_pad[kIn][kW] = {}, out_pad[kOut][kW];
  const float* in_ptr[kIn];
  float* out_ptr[kOut];
  for (int a = 0; a < kIn; ++a) {
    std::copy(in[a] + i, in[a] + end, in_pad[a]);
    in_ptr[a] = in_pad[a];
  }
  for (int a = 0; a < kOut; ++a) out_ptr[a] = out_pad[a];
  body(in_ptr, out_ptr, 0);
  for (int a = 0; a < kOut; ++a) std::copy(out_pad[a], out_pad[a] + rest, out[a] + i);
}

// 1 + exp(-g): the forward divides g by it, the backward's sigmoid is its inverse.
vf one_plus_exp_minus(vf g) { return add(set1(1.0f), exp(sub(zero(), g))); }

// in = {gate, up}, out = {out}
void swiglu_forward_vector(const float* const (&in)[2], float* const (&out)[1], int64_t i) {
  const vf g = load(in[0] + i);
  store(out[0] + i, mul(div(g, one_plus_exp_minus(g)), load(in[1] + i)));
}

// With s = sigmoid(g): d silu / dg = s * (1 + g * (1 - s)).
//   dgate = dout * up * s * (1 + g * (1 - s)),   dup = dout * g * s
// in = {dout, gate, up}, out = {dgate, dup} or {dgate, dup, out}: with a third output
// it also stores the forward's value, by the forward's own operations.
template <int kOut>
void swiglu_backward_vector(const float* const (&in)[3], float* const (&out)[kOut], int64_t i) {
  const vf dy = load(in[0] + i), g = load(in[1] + i), u = load(in[2] + i), one = set1(1.0f);
  const vf denominator = one_plus_exp_minus(g);
  if constexpr (kOut == 3) store(out[2] + i, mul(div(g, denominator), u));
  const vf s = div(one, denominator);
  store(out[1] + i, mul(dy, mul(g, s)));
  store(out[0] + i, mul(mul(dy, u), mul(s, add(one, mul(g, sub(one, s))))));
}

template <int kOut>
void swiglu_backward_ranges(const float* const (&in)[3], float* const (&result)[kOut], int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c)
    vector_range(in, result, c * kChunk, std::min(n, (c + 1) * kChunk), swiglu_backward_vector<kOut>);
}

}  // namespace

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel(), chunks = (n + kChunk - 1) / kChunk;
  const float* const in[2] = {gate.data, up.data};
  float* const result[1] = {out.data};
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c)
    vector_range(in, result, c * kChunk, std::min(n, (c + 1) * kChunk), swiglu_forward_vector);
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor out) {
  const float* const in[3] = {dout.data, gate.data, up.data};
  if (out.data) {
    float* const result[3] = {dgate.data, dup.data, out.data};
    swiglu_backward_ranges(in, result, gate.numel());
  } else {
    float* const result[2] = {dgate.data, dup.data};
    swiglu_backward_ranges(in, result, gate.numel());
  }
}

}  // namespace hdp::cpu
