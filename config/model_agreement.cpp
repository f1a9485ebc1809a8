#include "config/model_agreement.h"

#include <set>

#include "config/schema.h"

namespace hdp {
namespace {

// The keys that fix which weights a model has and their shapes.
const std::set<std::string> kShapeKeys = {"model.vocab_size",     "model.hidden_size",  "model.num_layers",
                                          "model.num_heads",      "model.num_kv_heads", "model.ffn_hidden_size",
                                          "model.tie_embeddings", "model.num_experts"};
// Training's own settings: the weights compute the same under any value.
const std::set<std::string> kTrainingKeys = {"model.init_std", "model.router_aux_loss_coef"};

bool is_rope_scaling_parameter(const std::string& key) {
  return key.starts_with("model.rope_") && key != "model.rope_theta" && key != "model.rope_scaling";
}

}  // namespace

std::vector<ModelKeyDifference> model_differences(const Config& config, const Config& other) {
  const ModelConfig &a = config.model, &b = other.model;
  const bool experts = a.moe() || b.moe();
  const bool llama3 = a.rope_scaling == RopeScaling::Llama3 || b.rope_scaling == RopeScaling::Llama3;
  Config ours = config, theirs = other;  // the schema's references point into a Config it may write
  std::vector<ModelKeyDifference> out;
  for (const Field& f : find_section("model")->fields) {
    const std::string key = "model." + f.key;
    const std::string value = value_text(f.ref(ours)), other_value = value_text(f.ref(theirs));
    if (value == other_value || kTrainingKeys.count(key)) continue;
    if (!experts && (key == "model.num_experts" || key == "model.experts_per_token")) continue;
    if (!llama3 && is_rope_scaling_parameter(key)) continue;
    // llama and mistral hold the same weights; a mixture of experts holds others.
    const bool shape = kShapeKeys.count(key) || (key == "model.arch" && a.moe() != b.moe());
    out.push_back({key, value, other_value, shape ? ModelKeyKind::Shape : ModelKeyKind::Numerics});
  }
  return out;
}

std::string describe_model_differences(const std::vector<ModelKeyDifference>& differences, const std::string& name,
                                       const std::string& other_name) {
  std::string text;
  for (const ModelKeyDifference& d : differences)
    text += (text.empty() ? "" : "; ") + d.key + " " + d.value + " (" + name + ") vs " + d.other_value + " (" +
            other_name + ")";
  return text;
}

}  // namespace hdp
