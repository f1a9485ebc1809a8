// Reading a config: the YAML file, then --set overrides, key by key through the
// schema (config/schema.h), then the checks (config/checks.h). Every error is one
// line: "<where>: <key.path>: <problem>; <what is valid>".

#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "base/yaml_reader.h"
#include "config/checks.h"
#include "config/parser.h"
#include "config/schema.h"

namespace hdp {
namespace {

Config read_config(const YamlDocument& document, const std::vector<std::string>& overrides, bool check_files) {
  ConfigParser parser;
  parser.source = document.source();
  parser.config.source = document.source();
  parser.read_document(document);
  for (const std::string& o : overrides) parser.apply_override(o);
  check_config(parser.config, check_files);
  parser.config.yaml = emit_config_yaml(parser.config);
  return parser.config;
}

}  // namespace

std::string emit_config_yaml(const Config& config) {
  Config& c = const_cast<Config&>(config);  // FieldRef is non-const; nothing is written
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const Section& section : config_schema()) {
    out << YAML::Key << section.name << YAML::Value << YAML::BeginMap;
    for (const Field& f : section.fields) {
      out << YAML::Key << f.key << YAML::Value;
      emit_value(out, f.ref(c));
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

Config parse_config_text(const std::string& yaml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides, bool check_files) {
  return read_config(YamlDocument::parse(yaml_text, source_name), overrides, check_files);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, bool check_files) {
  return read_config(
      YamlDocument::read_file(path, "config", "pass an existing YAML file, e.g. configs/tiny-llama.yaml"), overrides,
      check_files);
}

void validate_dataset_vocab(const Config& config, int64_t dataset_vocab_size, uint32_t dataset_max_token_id) {
  // The dataset's whole vocabulary must fit, not only the ids it happens to hold:
  // a tokenizer larger than the embedding means the data was made for another model.
  if (dataset_vocab_size <= config.model.vocab_size && static_cast<int64_t>(dataset_max_token_id) < config.model.vocab_size)
    return;
  std::string where = (config.source.empty() ? "(config)" : config.source) + ":1";
  if (auto it = config.origins.find("model.vocab_size"); it != config.origins.end()) where = it->second;
  else if (auto it = config.origins.find("model"); it != config.origins.end()) where = it->second;
  const int64_t needed = std::max(static_cast<int64_t>(dataset_max_token_id) + 1, dataset_vocab_size);
  const std::string valid = "set model.vocab_size to at least " + std::to_string(needed) +
                            " (the dataset's vocabulary), or point data.path at a dataset made for this model";
  throw_config_error(where, "model.vocab_size",
       std::to_string(config.model.vocab_size) + " is too small for data.path '" + config.data.path +
           "', whose tokenizer's vocabulary has " + std::to_string(dataset_vocab_size) +
           " entries (largest token id in it " + std::to_string(dataset_max_token_id) + ")",
       valid);
}

void check_output_directories(const Config& config, int rank) {
  namespace fs = std::filesystem;
  auto check = [&](const std::string& key, const std::string& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::string problem;
    if (ec) {
      problem = "cannot create the directory '" + dir + "' (" + ec.message() + ")";
    } else {
      // Only writing shows it: permissions, read-only mounts and quotas all say no here.
      const fs::path probe = fs::path(dir) / (".write-check-rank-" + std::to_string(rank));
      errno = 0;
      const bool written = static_cast<bool>(std::ofstream(probe) << "ok\n");
      if (!written) problem = "cannot write in the directory '" + dir + "' (" + std::strerror(errno) + ")";
      fs::remove(probe, ec);
    }
    if (problem.empty()) return;
    std::string where = (config.source.empty() ? "(config)" : config.source) + ":1";
    if (auto it = config.origins.find(key); it != config.origins.end()) where = it->second;
    else if (auto it = config.origins.find("train"); it != config.origins.end()) where = it->second;
    throw_config_error(where, key, problem + " on rank " + std::to_string(rank),
                       "point it at a directory this user can create and write, or fix its permissions");
  };
  if (rank == 0) check("train.run_dir", config.train.run_dir);
  if (config.train.checkpoint_every > 0) check("train.checkpoint_dir", config.train.checkpoint_dir);
}

}  // namespace hdp
