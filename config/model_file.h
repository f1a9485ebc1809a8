#pragma once
// The model files of `trainer plan` (configs/models/*.yaml, a Hugging Face
// import's model section): the training config's model section in a file of its
// own, read and checked by the same schema entries and model rules. Built into
// hdp_config_schema, which links only base/ and spec/, so that `trainer plan`
// reads them without the runtime.

#include <string>

#include "config/config.h"

namespace hdp {

// A model described in a file of its own (`trainer plan`'s configs/models/*.yaml):
// the keys of the config's model section at the top level, read and checked as
// that section is (the same names, defaults, rules and messages, which name
// <file>:<line> and model.<key>), and `name`, a label for reports (default: the
// file's stem). Such a file describes a model at scale, so its sizes (vocab_size,
// hidden_size, num_layers, num_heads, num_kv_heads, ffn_hidden_size) are required
// rather than left at the demo's defaults, and Mixtral's keys are refused on
// another architecture, which would ignore them. Throws ConfigError.
struct ModelFile {
  std::string name;
  ModelConfig model;
};
ModelFile read_model_file(const std::string& path);

// The model section alone (spec/model_checks.h), worded and located as
// check_config words it (config/checks.h runs it first).
void check_model_section(const Config& config);

}  // namespace hdp
