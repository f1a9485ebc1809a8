#pragma once
// The rules a model keeps, alone and split over a parallel layout, defined once:
// the training config's model and parallel sections (config/), `trainer plan`'s
// model files (read as that model section) and layouts, Hugging Face import
// (config.json mapped onto a ModelConfig) and the model itself (model/partition.cpp,
// through tp_divides_kv_heads) all check through these functions, so a layout the
// planner accepts is one the trainer accepts.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "spec/model_config.h"
#include "spec/model_shape.h"
#include "spec/parallel_degrees.h"

namespace hdp {

// A broken rule. `key` is the key it is about as the training config spells it
// ("model.num_kv_heads", "parallel.tp"); `related` the other keys the rule
// involves, most telling first (where a message points when `key` itself was
// not written down).
struct ModelIssue {
  std::string key;
  std::string problem;
  std::string valid;
  std::vector<std::string> related;
};

// How messages word keys and values for one reader: the training config marks a
// value left at its default "(default)"; Hugging Face's config.json calls
// model.num_heads num_attention_heads. Unset members leave names and values as
// they are.
struct KeyWording {
  std::function<std::string(const std::string& key)> name;
  std::function<std::string(const std::string& key, const std::string& value)> value;

  std::string name_of(const std::string& key) const { return name ? name(key) : key; }
  // "<value>" as this reader shows the value of `key`.
  std::string shown(const std::string& key, const std::string& value) const {
    return this->value ? this->value(key, value) : value;
  }
};

// The most layers and experts a model may have: host-side tables are sized per
// layer and per expert (the stage split's costs, the parameter table) before any
// weight is allocated, so an absurd count must be refused, not tried. The largest
// models today have a few hundred layers and a few hundred experts.
inline constexpr int64_t kMaxLayers = 65536;
inline constexpr int64_t kMaxExperts = 65536;

// "<key>: <problem>; <valid>", with the wording's name of the key.
std::string describe_issue(const ModelIssue& issue, const KeyWording& wording = {});

// The first rule the model breaks, in key order: its architecture and sliding
// window (LLaMA has none, Mistral and Mixtral may), positive sizes, heads that
// divide the hidden size into an even head dimension (RoPE rotates pairs), KV
// heads that divide the heads, and for Mixtral its experts.
std::optional<ModelIssue> model_issue(const ModelConfig& model, const KeyWording& wording = {});

// The first rule the split of a model (its shape, ModelConfig::shape) over
// `layout` breaks: degrees of at least 1; tp dividing the KV heads
// (tp_divides_kv_heads, spec/model_shape.h), the query heads and the FFN width,
// and at most the vocabulary; at most one pipeline stage per layer; ep only for a
// mixture of experts, dividing hdp and the experts. Keys are named as the
// config's parallel and model sections name them.
std::optional<ModelIssue> layout_issue(const ModelShape& model, const ParallelDegrees& layout,
                                       const KeyWording& wording = {});

}  // namespace hdp
