#pragma once
// AdamW over the flat parameter buffer (decoupled weight decay, bias correction,
// fp32 master weights and moments), the learning-rate schedule, and global
// gradient-norm clipping. The moments are laid out like the parameters, so a
// later ZeRO-1 shard is just a range of the same flat layout.

#include <cstdint>
#include <vector>

#include "kernels/allocator.h"
#include "trainer/config.h"
#include "trainer/model.h"

namespace hdp {

// Linear warmup from 0 to lr over warmup_steps, then cosine decay to min_lr at total_steps.
// `step` is 1-based (the step about to be taken).
double learning_rate(const OptimConfig& optim, int64_t step, int64_t total_steps);

// The factor gradients are multiplied by so their global norm is at most max_norm
// (1 when max_norm is 0 or the norm is already small enough).
float clip_factor(double grad_norm, double max_norm);

class AdamW {
 public:
  AdamW(const OptimConfig& optim, const std::vector<ParameterInfo>& parameters, int64_t flat_numel,
        Device device = Device::CPU);

  // Updates params from grads with the given learning rate; `step` is 1-based.
  void step(Tensor params, const Tensor& grads, double lr, float grad_scale, int64_t step);

  Tensor exp_avg() const { return m_; }
  Tensor exp_avg_sq() const { return v_; }
  size_t state_bytes() const { return arena_.capacity(); }

 private:
  OptimConfig optim_;
  std::vector<ParameterInfo> parameters_;
  Arena arena_;
  Tensor m_, v_;
};

}  // namespace hdp
