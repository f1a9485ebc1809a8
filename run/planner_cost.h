#pragma once
// The cost model a training run plans with (scheduler.cost_file): read from a
// cost file written by `trainer profile` (planning/cost_file.h), measured at
// start-up ("profile"), or derived from FLOPs (empty), for this run's model
// shape and tensor-parallel degree.

#include <cstdint>
#include <string>

#include "planning/cost_file.h"
#include "planning/cost_model.h"
#include "config/config.h"

namespace hdp {

class Communicator;

// Throws ConfigError naming both shapes when the file was profiled for another
// model shape than config.model (hidden size, heads, kv heads, head dim, FFN
// size, vocabulary size). `where` names the file in the message.
void check_cost_file_shape(const CostFile& file, const Config& config, const std::string& where);

// The model a training rank plans with from a profiled cost file: layer times and
// the head per token divided by config.parallel.tp / profiled tp (a tp rank runs
// that share of the matmuls and attention heads; the all-reduces and the
// unsplit norms are not modelled), activation bytes scaled by the ratio of this
// rank's saved floats per token to the profiled layer's (exact for the slope).
CostModel cost_model_from_file(const CostFile& file, const Config& config, int64_t saved_floats_per_token);

// flops_per_second: one rank's compute rate (for the FLOP-derived model);
// saved_floats_per_token: what one layer of this rank's model keeps for backward.
// scheduler.cost_file: empty -> derived_cost_model; a path -> read_cost_file,
// checked against the model shape, cost_model_from_file; "profile" -> measured now
// (startup_profile_options, a few seconds) and logged. Every rank must plan with
// the same model: with "profile" in a job of several ranks pass `world` (every
// rank then measures and all take the average, a collective call); without it the
// measurement is this rank's own.
CostModel planner_cost_model(const Config& config, double flops_per_second, int64_t saved_floats_per_token,
                             Communicator* world = nullptr);

// The FLOP-derived model of one tensor-parallel rank's slice of a layer.
CostModel derived_cost_model(const Config& config, double flops_per_second, int64_t saved_floats_per_token);

// Expert parallelism's all-to-alls per token and layer (model/moe.h), which block the
// layer as its compute does: dispatch and combine forward and their gradients
// backward, four row all-to-alls each sending experts_per_token rows of hidden_size
// values per token (train.precision's element size), (ep - 1) / ep of them to other
// ranks:
//   4 x experts_per_token x hidden_size x element bytes x (ep - 1) / ep / bandwidth
// seconds. The bandwidth is the cost model's copy bandwidth, min(d2h, h2d): the only
// bandwidth the model has (offload.bandwidth_gbs, or the profiler's measured copy);
// on the CPU backend, the only one Mixtral runs on, ranks of a node exchange through
// shared memory, which is such a copy. The count exchange before dispatch
// (num_experts numbers) is latency, which the model has no term for. 0 with
// parallel.ep 1.
double expert_all_to_all_seconds_per_token(const Config& config, const CostModel& cost);
}  // namespace hdp
