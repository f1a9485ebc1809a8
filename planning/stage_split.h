#pragma once
// How a model's layers are split over pipeline stages when the config does not
// say (parallel.pp_layers): one definition for the trainer and for `trainer plan`'s
// simulator, so the simulator splits as the trainer would.

#include <cstdint>
#include <vector>

#include "model/model_shape.h"

namespace hdp {

// Layers per stage of pp, each stage a group of tp tensor-parallel ranks, for
// sequences of at most seq_len tokens: the contiguous split (parallel/pipeline.h
// split_layers) that balances the stages' forward + backward work per token on one
// rank. Throws std::invalid_argument when the shape does not split (validate_split).
std::vector<int64_t> stage_layer_split(const ModelShape& model, int tp, int pp, int64_t seq_len);

}  // namespace hdp
