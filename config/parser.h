#pragma once
// ConfigParser: a YAML document's sections and keys, and --set overrides, read
// one key at a time through the schema (config/schema.h) into a Config, noting
// where each key was set (Config::origins). It checks each value's type as it
// assigns it; the rules on values are config/checks.h's. Shared by the training
// config (config/config.h) and a model file (config/model_file.h).

#include <string>
#include <vector>

#include "base/yaml_reader.h"
#include "config/config.h"
#include "config/schema.h"

namespace hdp {

struct ConfigParser {
  std::string source;  // named in messages
  Config config;
  // Keys this build retired (parser.cpp: kRetiredKeys) are skipped instead of refused: set
  // for a config stored in a checkpoint, which holds every key of the build that wrote it.
  bool skip_retired_keys = false;

  // Every section of `document`; an unknown section or key is an error that
  // suggests the closest name.
  void read_document(const YamlDocument& document);
  void read_section(const YamlDocument& document, const Section& section, const YamlEntry& header);
  // The keys of `section` in `keys`; those in `other_keys` are left to the caller.
  void read_keys(const YamlMap& keys, const Section& section, const std::vector<std::string>& other_keys = {});
  // One `section.key=value` (--set).
  void apply_override(const std::string& text);
};

}  // namespace hdp
