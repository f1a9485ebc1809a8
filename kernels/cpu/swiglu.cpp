// SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g) = g / (1 + exp(-g))
// (torch computes silu as x / (1 + exp(-x))). exp is fast_expf (fast_math.h);
// these loops vectorise.

#include <omp.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fast_math.h"

namespace hdp::cpu {
namespace {
constexpr int64_t kParallelMin = 1 << 14;
}

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel();
  const float* __restrict g = gate.data;
  const float* __restrict u = up.data;
  float* __restrict o = out.data;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    o[i] = gi / (1.0f + fast_expf(-gi)) * u[i];
  }
}

// With s = sigmoid(g): d silu / dg = s * (1 + g * (1 - s)).
//   dgate = dout * up * s * (1 + g * (1 - s)),   dup = dout * g * s
void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const int64_t n = gate.numel();
  const float* __restrict g = gate.data;
  const float* __restrict u = up.data;
  const float* __restrict dy = dout.data;
  float* __restrict dg = dgate.data;
  float* __restrict du = dup.data;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float s = 1.0f / (1.0f + fast_expf(-gi));
    const float silu = gi * s;
    du[i] = dy[i] * silu;
    dg[i] = dy[i] * u[i] * (s * (1.0f + gi * (1.0f - s)));
  }
}

}  // namespace hdp::cpu
