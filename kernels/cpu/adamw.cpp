// AdamW as torch.optim.AdamW (single-tensor path, the CPU default):
//   param.mul_(1 - lr * wd)
//   m.lerp_(g, 1 - beta1)                      (m += (1 - beta1) * (g - m))
//   v.mul_(beta2).addcmul_(g, g, 1 - beta2)
//   denom = sqrt(v) / sqrt(1 - beta2^step) + eps
//   param.addcdiv_(m, denom, -lr / (1 - beta1^step))
// with g = grad * grad_scale. Scalars are formed in double and rounded to float
// once, as torch does with its Python-float hyper-parameters; elementwise math is float.
// With param_bf16, each updated parameter is also stored rounded to bf16 (the compute
// copy of mixed precision, kernels/ops.h).

#include <omp.h>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {

void adamw_update(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWStep& s, Tensor param_bf16) {
  const int64_t n = param.numel();
  const double lr = s.lr, b1 = s.beta1, b2 = s.beta2;
  const double step = static_cast<double>(s.step);
  const float decay = static_cast<float>(1.0 - lr * static_cast<double>(s.weight_decay));
  const float w1 = static_cast<float>(1.0 - b1);  // lerp weight
  const float beta2 = s.beta2;
  const float one_minus_b2 = static_cast<float>(1.0 - b2);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(b1, step)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, step)));
  const float eps = s.eps, gs = s.grad_scale;
  float* __restrict p = param.data;
  const float* __restrict gr = grad.data;
  float* __restrict mm = m.data;
  float* __restrict vv = v.data;
  hdp::bf16* __restrict pb = param_bf16.data ? param_bf16.bf16_data() : nullptr;
  const bool lerp_low = w1 < 0.5f;
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float g = gr[i] * gs;
    const float pi = p[i] * decay;
    // torch's lerp: weight < 0.5 ? start + w * (end - start) : end - (end - start) * (1 - w)
    const float mi = lerp_low ? mm[i] + w1 * (g - mm[i]) : g - (g - mm[i]) * (1.0f - w1);
    const float vi = vv[i] * beta2 + one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    mm[i] = mi;
    vv[i] = vi;
    p[i] = pi - step_size * (mi / denom);
    if (pb) pb[i] = to_bf16(p[i]);
  }
}

}  // namespace hdp::cpu
