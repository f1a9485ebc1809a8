#include "trainer/optimizer.h"

#include <cmath>

#include "kernels/ops.h"

namespace hdp {

double learning_rate(const OptimConfig& optim, int64_t step, int64_t total_steps) {
  if (optim.warmup_steps > 0 && step <= optim.warmup_steps) {
    return optim.lr * static_cast<double>(step) / static_cast<double>(optim.warmup_steps);
  }
  const int64_t decay_steps = total_steps - optim.warmup_steps;
  if (decay_steps <= 0) return optim.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - optim.warmup_steps) / static_cast<double>(decay_steps));
  return optim.min_lr + 0.5 * (optim.lr - optim.min_lr) * (1.0 + std::cos(M_PI * progress));
}

float clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !(grad_norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (grad_norm + 1e-6));
}

AdamW::AdamW(const OptimConfig& optim, const std::vector<ParameterInfo>& parameters, int64_t flat_numel,
             Device device)
    : optim_(optim),
      parameters_(parameters),
      arena_(device, 2 * static_cast<size_t>(flat_numel) * sizeof(float), "optimizer") {
  m_ = arena_.tensor({flat_numel});
  v_ = arena_.tensor({flat_numel});
  fill(m_, 0.0f);
  fill(v_, 0.0f);
}

void AdamW::step(Tensor params, const Tensor& grads, double lr, float grad_scale, int64_t step) {
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(optim_.beta1);
  s.beta2 = static_cast<float>(optim_.beta2);
  s.eps = static_cast<float>(optim_.eps);
  s.step = step;
  s.grad_scale = grad_scale;
  for (const ParameterInfo& p : parameters_) {
    s.weight_decay = p.weight_decay ? static_cast<float>(optim_.weight_decay) : 0.0f;
    auto range = [&](const Tensor& flat) { return Tensor(flat.data + p.offset, {p.numel}, flat.device); };
    adamw_update(range(params), range(grads), range(m_), range(v_), s);
  }
}

}  // namespace hdp
