#include "config/pipeline_layers.h"

#include <algorithm>

#include "planning/stage_split.h"

namespace hdp {

std::vector<int64_t> pipeline_layers(const Config& config) {
  if (!config.parallel.pp_layers.empty()) return config.parallel.pp_layers;
  return stage_layer_split(config.model.shape(), config.parallel.tp, config.parallel.pp, config.data.max_seq_len);
}

int64_t smallest_stage_layers(const Config& config) {
  const std::vector<int64_t> layers = pipeline_layers(config);
  return *std::min_element(layers.begin(), layers.end());
}

}  // namespace hdp
