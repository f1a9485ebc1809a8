#include "planning/stage_split.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace hdp {

std::vector<int64_t> split_layers(int64_t num_layers, int stages, double layer_cost, double first_extra,
                                  double last_extra) {
  if (stages < 1 || num_layers < stages) {
    throw std::invalid_argument("pipeline: " + std::to_string(num_layers) + " layers cannot fill " +
                                std::to_string(stages) + " stages");
  }
  const int64_t L = num_layers;
  auto cost = [&](int s, int64_t n) {
    return static_cast<double>(n) * layer_cost + (s == 0 ? first_extra : 0.0) + (s == stages - 1 ? last_extra : 0.0);
  };
  // best[s][l]: the smallest possible maximum stage cost of the first l layers over stages 0..s-1.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  best[0][0] = 0;
  // Stage s - 1 takes the last n of l layers: the rest costs best[s - 1][l - n], which
  // does not grow as n grows (fewer layers before it), while its own cost(s - 1, n)
  // grows with n. The max of the two is least where they cross, found by bisection:
  // O(stages L log L) rather than O(stages L^2), so a model of a million layers plans
  // in well under a second.
  for (int s = 1; s <= stages; ++s) {
    for (int64_t l = s; l <= L; ++l) {
      auto at = [&](int64_t n) { return std::max(best[s - 1][l - n], cost(s - 1, n)); };
      int64_t lo = 1, hi = l - (s - 1);  // the first n whose own cost reaches the rest's
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cost(s - 1, mid) >= best[s - 1][l - mid]) hi = mid; else lo = mid + 1;
      }
      best[s][l] = lo > 1 ? std::min(at(lo), at(lo - 1)) : at(lo);
    }
  }
  // Rebuild from the last stage, giving each stage as many layers as the optimum allows.
  const double target = best[stages][L] * (1 + 1e-12);
  std::vector<int64_t> layers(stages);
  int64_t left = L;
  for (int s = stages - 1; s >= 0; --s) {
    for (int64_t n = left - s; n >= 1; --n) {
      if (cost(s, n) <= target && best[s][left - n] <= target) {
        layers[s] = n;
        left -= n;
        break;
      }
    }
  }
  return layers;
}


std::vector<int64_t> stage_layer_split(const ModelShape& model, int tp, int pp, int64_t seq_len, int vpp) {
  validate_model_shape(model);
  validate_split(model, tp, pp, vpp);
  // A layer counts its attention at the longest sequence: attention grows with the
  // sequence and at long context outweighs the matmuls (LLaMA-7B at 256K tokens:
  // 6.4 GFLOP of attention per token and layer against 1.1 of matmuls), so a split
  // without it weighs the LM head as several layers and starves the last stage. The longest
  // sequence is what is known before the data (a run keeps one split), and packed
  // micro-batches of shorter ones cost less attention per token, which this split
  // then overestimates.
  // The embedding lookup copies one row of hidden values per token on every tp
  // rank (the vocabulary is sharded, the row is not); the layers and the LM head
  // shrink by tp.
  // Under interleaved 1F1B the pp x vpp virtual stages are balanced alike: each is
  // one pass of a micro-batch through a stage (Narayanan et al. 2021, section 2.2.2).
  return split_layers(model.layers, pp * vpp, layer_flops_per_token(model, tp, seq_len), static_cast<double>(model.hidden),
                      head_flops_per_token(model, tp));
}

std::vector<int64_t> layers_per_stage(std::span<const int64_t> virtual_stage_layers, int pp) {
  std::vector<int64_t> layers(pp, 0);
  for (size_t v = 0; v < virtual_stage_layers.size(); ++v) layers[v % pp] += virtual_stage_layers[v];
  return layers;
}

}  // namespace hdp
