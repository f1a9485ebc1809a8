#include "config/pipeline_layers.h"

#include <algorithm>

#include "planning/stage_split.h"

namespace hdp {

std::vector<int64_t> virtual_stage_layers(const Config& config) {
  const ParallelConfig& p = config.parallel;
  if (!p.pp_layers.empty()) return p.pp_layers;
  return stage_layer_split(config.model.shape(), p.tp, p.pp, config.data.max_seq_len, p.vpp);
}

std::vector<int64_t> pipeline_layers(const Config& config) {
  return layers_per_stage(virtual_stage_layers(config), config.parallel.pp);
}

int64_t smallest_stage_layers(const Config& config) {
  const std::vector<int64_t> layers = pipeline_layers(config);
  return *std::min_element(layers.begin(), layers.end());
}

std::vector<int64_t> recomputed_layers_per_stage(const Config& config) {
  const int pp = config.parallel.pp;
  const std::vector<int64_t> chunks = virtual_stage_layers(config);  // chunk c of stage s: c x pp + s
  std::vector<int64_t> recomputed(static_cast<size_t>(pp), 0);
  if (config.train.recompute == RecomputeMode::None) return recomputed;
  for (size_t v = 0; v < chunks.size(); ++v)
    recomputed[v % static_cast<size_t>(pp)] += std::min(config.train.recompute_layers.value_or(chunks[v]), chunks[v]);
  return recomputed;
}

}  // namespace hdp
