#include "planning/cost_model.h"

#include <stdexcept>
#include <string>

namespace hdp {

double CostModel::compute_seconds(int64_t s) const {
  const double x = static_cast<double>(s);
  return a1 * x * x + b1 * x + g;
}

double CostModel::activation_bytes(int64_t s) const { return a2 * static_cast<double>(s) + b2; }

CostModel analytic_cost_model(const LayerShape& shape, double flops_per_second, double copy_bytes_per_second) {
  if (!(flops_per_second > 0)) {
    throw std::invalid_argument("analytic_cost_model: the FLOP rate must be positive, got " +
                                std::to_string(flops_per_second));
  }
  if (!(copy_bytes_per_second >= 0)) {
    throw std::invalid_argument("analytic_cost_model: the copy rate must not be negative, got " +
                                std::to_string(copy_bytes_per_second));
  }
  const double qdim = static_cast<double>(shape.heads * shape.head_dim);
  const double kvdim = static_cast<double>(shape.kv_heads * shape.head_dim);
  const double hidden = static_cast<double>(shape.hidden), ffn = static_cast<double>(shape.ffn);
  const double matmul_params = hidden * (qdim + 2 * kvdim) + qdim * hidden + 3 * hidden * ffn;
  CostModel m;
  m.a1 = 6 * qdim / flops_per_second;
  m.b1 = (6 * matmul_params + 6 * qdim) / flops_per_second;
  m.g = 0;
  m.a2 = 4.0 * static_cast<double>(shape.saved_floats_per_token);
  m.b2 = 0;
  m.d2h_bytes_per_s = copy_bytes_per_second;
  m.h2d_bytes_per_s = copy_bytes_per_second;
  return m;
}

}  // namespace hdp
