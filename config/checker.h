#pragma once
// Checker: where a message about a key of a config points and how its values are
// worded, shared by the checks between keys (config/checks.cpp) and the model
// section's check (config/model_file.cpp).

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/schema.h"
#include "spec/model_checks.h"

namespace hdp {

// Where and how a message about a key of `config` is worded.
class Checker {
 public:
  explicit Checker(const Config& config) : config(config) {}

  // Where to point for `key`: where it was set, else where one of `related`
  // was set, else its section header, else the top of the file.
  std::string origin(const std::string& key, const std::vector<std::string>& related = {}) const {
    if (auto it = config.origins.find(key); it != config.origins.end()) return it->second;
    for (const std::string& r : related)
      if (auto it = config.origins.find(r); it != config.origins.end()) return it->second;
    const std::string section = key.substr(0, key.find('.'));
    if (auto it = config.origins.find(section); it != config.origins.end()) return it->second;
    return config.source + ":1";
  }

  // `value` of `key` for messages, marked "(default)" when the key was not set.
  std::string marked(const std::string& key, const std::string& value) const {
    return config.origins.count(key) ? value : value + " (default)";
  }
  std::string shown(const std::string& key) const {
    return marked(key, value_text(schema_field(key).ref(const_cast<Config&>(config))));  // read only
  }
  // The model's rules (spec/model_checks.h) in this config's wording.
  KeyWording wording() const {
    return KeyWording{{}, [this](const std::string& key, const std::string& value) { return marked(key, value); }};
  }

  void require(bool ok, const std::string& key, const std::string& problem, const std::string& valid,
               const std::vector<std::string>& related = {}) const {
    if (!ok) throw_config_error(origin(key, related), key, problem, valid);
  }
  void require(const std::optional<ModelIssue>& issue) const {
    if (issue) throw_config_error(origin(issue->key, issue->related), issue->key, issue->problem, issue->valid);
  }

  const Config& config;
};

}  // namespace hdp
