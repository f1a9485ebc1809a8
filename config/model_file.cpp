#include "config/model_file.h"

#include <filesystem>

#include "base/yaml_reader.h"
#include "config/checker.h"
#include "config/parser.h"
#include "config/schema.h"
#include "spec/model_checks.h"

namespace hdp {

void check_model_section(const Config& config) {
  const Checker c(config);
  c.require(model_issue(config.model, c.wording()));
}

ModelFile read_model_file(const std::string& path) {
  const YamlDocument document =
      YamlDocument::read_file(path, "model", "pass a model file such as configs/models/llama-7b.yaml");
  const YamlMap keys = document.root_map();
  ConfigParser parser;
  parser.source = path;
  parser.config.source = path;
  const Section& section = *find_section("model");
  parser.read_keys(keys, section, {"name"});
  const Config& config = parser.config;
  ModelFile file;
  file.name = keys.get_or<std::string>("name", std::filesystem::path(path).stem().string());
  file.model = config.model;
  // A file describes a model at scale: its sizes never fall back to the demo's defaults.
  const std::vector<std::string> sizes = {"vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                          "ffn_hidden_size"};
  for (const std::string& size : sizes) {
    if (!config.origins.count("model." + size))
      throw_config_error(path, "model." + size, "required key is missing",
                         "a model file gives its sizes: " + join_names(sizes));
  }
  // Mixtral's keys would be ignored on another architecture: a file that gives them
  // most likely lacks arch: mixtral.
  if (!file.model.moe()) {
    for (const char* key : {"num_experts", "experts_per_token", "router_aux_loss_coef"}) {
      const auto it = config.origins.find("model." + std::string(key));
      if (it != config.origins.end())
        throw_config_error(it->second, it->first, "is for model.arch 'mixtral' only, and this model's is '" + file.model.arch + "'",
                           "write arch: mixtral for a mixture of experts, or remove the key from a dense model");
    }
  }
  check_model_section(config);
  return file;
}

}  // namespace hdp
