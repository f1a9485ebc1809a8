#pragma once
// Whether a checkpoint's model is the model a config describes: train.init_from
// (run/job.cpp) and import-hf's --set (checkpoint/hf_checkpoint.cpp) take weights
// made for one model into a config that may describe another.

#include <string>
#include <vector>

#include "config/config.h"

namespace hdp {

// Shape: the weights cannot be loaded (their shapes or their set differ).
// Numerics: they load, but compute something else (RoPE, the norm's epsilon, the
// window, the routing). Keys that only steer training (init_std,
// router_aux_loss_coef) are never differences.
enum class ModelKeyKind { Shape, Numerics };

struct ModelKeyDifference {
  std::string key;  // "model.rope_theta"
  std::string value, other_value;  // as messages show values: 'llama', 10000, null
  ModelKeyKind kind;
};

// The model keys whose values differ between `config` and `other`, in schema
// order; keys that matter to neither model (a dense model's expert counts, the
// llama3 factors without llama3 scaling) are left out.
std::vector<ModelKeyDifference> model_differences(const Config& config, const Config& other);

// "model.rope_theta 10000 (checkpoint) vs 500000 (config); ..." of `differences`,
// with `name` and `other_name` for the two configs.
std::string describe_model_differences(const std::vector<ModelKeyDifference>& differences, const std::string& name,
                                       const std::string& other_name);

}  // namespace hdp
