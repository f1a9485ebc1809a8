#pragma once
// How a model's layers are split over pipeline stages when the config does not
// say (parallel.pp_layers): one definition for the trainer and for `trainer plan`'s
// simulator, so the simulator splits as the trainer would.

#include <cstdint>
#include <span>
#include <vector>

#include "spec/model_shape.h"

namespace hdp {

// Layers per stage minimising the most expensive stage, in contiguous ranges.
// Stage costs: layers x layer_cost, plus first_extra on the first stage (embedding)
// and last_extra on the last (final norm, LM head, loss). Ties prefer earlier
// stages holding fewer layers. Every stage gets at least one layer.
std::vector<int64_t> split_layers(int64_t num_layers, int stages, double layer_cost, double first_extra,
                                  double last_extra);

// Layers per stage of pp, each stage a group of tp tensor-parallel ranks, for
// sequences of at most seq_len tokens: the contiguous split (split_layers) that balances
// the stages' forward + backward work per token on one rank. With vpp > 1 model chunks
// per stage (interleaved 1F1B, planning/pipeline_schedule.h) the split is over the
// pp x vpp virtual stages, chunk c of stage s being virtual stage c x pp + s.
// Throws std::invalid_argument when the shape does not split (validate_split: also
// vpp > 1 with one stage, or more virtual stages than layers).
std::vector<int64_t> stage_layer_split(const ModelShape& model, int tp, int pp, int64_t seq_len, int vpp = 1);

// The layers each of pp stages holds: the sum of its virtual stages' (v % pp == s).
std::vector<int64_t> layers_per_stage(std::span<const int64_t> virtual_stage_layers, int pp);

}  // namespace hdp
