#include "planning/cost_model.h"

#include <stdexcept>
#include <string>

namespace hdp {

double CostModel::compute_seconds(int64_t s) const {
  return a1 * attention_term(s) + b1 * static_cast<double>(s) + g;
}

double CostModel::attention_term(int64_t s) const {
  const double x = static_cast<double>(s);
  if (window <= 0 || s <= window) return x * x;
  return 2 * attention_pairs(s, window) - x;
}

double CostModel::recompute_seconds(int64_t s, bool ring) const {
  const double x = static_cast<double>(s);
  return ring ? rb_ring * x : ra * attention_term(s) + rb * x;
}

double CostModel::activation_bytes(int64_t s) const { return a2 * static_cast<double>(s) + b2; }

void price_recomputation(CostModel& cost, const ModelShape& model, int tp, RecomputeMode mode,
                         double flops_per_second, double share) {
  if (!(flops_per_second > 0) || !(share >= 0 && share <= 1)) {
    throw std::invalid_argument("price_recomputation: FLOP rate " + std::to_string(flops_per_second) + ", share " +
                                std::to_string(share));
  }
  const RecomputeFlops local = recompute_flops(model, tp, mode, false);
  const RecomputeFlops ring = recompute_flops(model, tp, mode, true);
  cost.ra = share * (local.per_pair / 2 / flops_per_second);
  cost.rb = share * ((local.per_token + local.per_pair / 2) / flops_per_second);
  cost.rb_ring = share * (ring.per_token / flops_per_second);
}

double implied_flops_per_second(const CostModel& cost, const ModelShape& model, int tp) {
  if (!(cost.b1 > 0)) return 0;
  return (layer_matmul_flops_per_token(model, tp) + attention_flops_per_token_pair(model, tp) / 2) / cost.b1;
}

CostModel analytic_cost_model(const ModelShape& model, int tp, double saved_bytes_per_token, double flops_per_second,
                              double copy_bytes_per_second, RecomputeMode recompute) {
  if (!(flops_per_second > 0)) {
    throw std::invalid_argument("analytic_cost_model: the FLOP rate must be positive, got " +
                                std::to_string(flops_per_second));
  }
  if (!(copy_bytes_per_second >= 0)) {
    throw std::invalid_argument("analytic_cost_model: the copy rate must not be negative, got " +
                                std::to_string(copy_bytes_per_second));
  }
  const double matmul = layer_matmul_flops_per_token(model, tp);
  const double attention = attention_flops_per_token_pair(model, tp);
  CostModel m;
  m.a1 = attention / 2 / flops_per_second;
  m.b1 = (matmul + attention / 2) / flops_per_second;
  m.g = 0;
  m.a2 = saved_bytes_per_token;
  m.b2 = 0;
  price_recomputation(m, model, tp, recompute, flops_per_second);
  m.window = model.window;
  m.d2h_bytes_per_s = copy_bytes_per_second;
  m.h2d_bytes_per_s = copy_bytes_per_second;
  return m;
}

}  // namespace hdp
