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
#include <sstream>
#include <system_error>
#include <utility>

#include "base/yaml_reader.h"
#include "config/checks.h"
#include "config/schema.h"

namespace hdp {
namespace {

// ---------------------------------------------------------------------------
// Messages

// A section name that is really a key of some section ("lr" -> "optim.lr").
std::string misplaced_key_hint(const std::string& name) {
  for (const Section& s : config_schema())
    if (find_field(s, name)) return "keys go inside their section: did you mean '" + s.name + "." + name + "'? ";
  return "";
}

[[noreturn]] void unknown_section(const std::string& where, const std::string& name) {
  std::string hint = misplaced_key_hint(name);
  if (hint.empty()) hint = did_you_mean(name, section_names());
  throw_config_error(where, name, "unknown section", hint + "valid sections: " + join_names(section_names()));
}

// `other_keys`: keys the document allows beside the section's (a model file's name).
[[noreturn]] void unknown_key(const std::string& where, const Section& section, const std::string& key,
                              const std::vector<std::string>& other_keys = {}) {
  std::vector<std::string> valid = key_names(section);
  valid.insert(valid.end(), other_keys.begin(), other_keys.end());
  throw_config_error(where, section.name + "." + key, "unknown key in section '" + section.name + "'",
                     did_you_mean(key, valid) + "valid keys in " + section.name + ": " + join_names(valid));
}

// ---------------------------------------------------------------------------
// Parsing

struct Parser {
  std::string source;
  Config config;

  void read_document(const YamlDocument& document) {
    const YAML::Node& root = document.root();
    if (root.IsNull()) return;
    if (!root.IsMap())
      throw_config_error(document.where(root), "(top level)",
                         "expected a mapping of sections, got " + describe_yaml(root),
                         "write sections " + join_names(section_names()) + " at the top level");
    const YamlMap sections(document, root, "", source);
    for (const YamlEntry& entry : sections.entries()) {
      const Section* section = find_section(entry.key);
      if (!section) unknown_section(entry.where, entry.key);
      config.origins[entry.key] = entry.where;
      read_section(document, *section, entry);
    }
  }

  void read_section(const YamlDocument& document, const Section& section, const YamlEntry& header) {
    if (header.value.IsNull()) return;
    if (!header.value.IsMap())
      throw_config_error(header.where, section.name, "expected a mapping of keys, got " + describe_yaml(header.value),
                         "valid keys in " + section.name + ": " + join_names(key_names(section)));
    read_keys(YamlMap(document, header.value, section.name, header.where), section);
  }

  // The keys of `section` in `keys`; those in `other_keys` are left to the caller.
  void read_keys(const YamlMap& keys, const Section& section, const std::vector<std::string>& other_keys = {}) {
    for (const YamlEntry& entry : keys.entries()) {
      if (std::find(other_keys.begin(), other_keys.end(), entry.key) != other_keys.end()) continue;
      const Field* f = find_field(section, entry.key);
      if (!f) unknown_key(entry.where, section, entry.key, other_keys);
      const std::string path = section.name + "." + entry.key;
      assign(f->ref(config), entry.value, entry.where, path);  // at the key's line, also for values on later lines
      config.origins[path] = entry.where;
    }
  }

  void apply_override(const std::string& text) {
    const std::string where = "--set " + text;
    const size_t eq = text.find('=');
    auto trim = [](std::string s) {
      const char* ws = " \t\r\n";
      s.erase(0, s.find_first_not_of(ws));
      const size_t last = s.find_last_not_of(ws);
      s.erase(last == std::string::npos ? 0 : last + 1);
      return s;
    };
    if (eq == std::string::npos)
      throw_config_error(where, "", "malformed override, there is no '='",
           "write --set section.key=value, e.g. --set optim.lr=1e-3");
    const std::string path = trim(text.substr(0, eq));
    const std::string raw_value = text.substr(eq + 1);
    if (path.empty())
      throw_config_error(where, "", "malformed override, the key path before '=' is empty",
           "write --set section.key=value, e.g. --set optim.lr=1e-3");
    const size_t dot = path.find('.');
    const std::string section_name = path.substr(0, dot);
    const Section* section = find_section(section_name);
    if (!section) unknown_section(where, section_name);
    if (dot == std::string::npos)
      throw_config_error(where, path, "an override must name a key inside the section",
           "write --set " + path + ".<key>=value with one of: " + join_names(key_names(*section)));
    const std::string key = path.substr(dot + 1);
    const Field* f = find_field(*section, key);
    if (!f) unknown_key(where, *section, key);
    YAML::Node value;
    try {
      value = YAML::Load(raw_value);
    } catch (const YAML::Exception& e) {
      throw_config_error(where, path, "cannot read the value as YAML (" + e.msg + ")",
           "quote it for the shell, e.g. --set '" + path + "=...'");
    }
    assign(f->ref(config), value, where, path);
    config.origins[path] = where;
  }
};

Config read_config(const YamlDocument& document, const std::vector<std::string>& overrides, bool check_files) {
  Parser parser;
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

ModelFile read_model_file(const std::string& path) {
  const YamlDocument document =
      YamlDocument::read_file(path, "model", "pass a model file such as configs/models/llama-7b.yaml");
  const YamlMap keys = document.root_map();
  Parser parser;
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

namespace {

// "section.key" -> value of each line of an effective config, in order.
std::vector<std::pair<std::string, std::string>> config_lines(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> lines;
  std::istringstream in(yaml);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t indent = line.find_first_not_of(' ');
    const size_t start = line.find_first_not_of(' ', colon + 1);
    const std::string value = start == std::string::npos ? "" : line.substr(start);
    if (indent == 0) {
      section = line.substr(0, colon);
      if (!value.empty()) lines.emplace_back(section, value);
    } else {
      lines.emplace_back(section + "." + line.substr(indent, colon - indent), value);
    }
  }
  return lines;
}

}  // namespace

std::vector<ConfigDifference> config_differences(const std::string& yaml, const std::string& other_yaml) {
  const auto ours = config_lines(yaml), theirs = config_lines(other_yaml);
  auto value_in = [](const std::vector<std::pair<std::string, std::string>>& lines, const std::string& key) {
    for (const auto& [k, v] : lines)
      if (k == key) return v;
    return std::string("(absent)");
  };
  std::vector<ConfigDifference> differences;
  for (const auto& [key, value] : ours) {
    const std::string other = value_in(theirs, key);
    if (other != value) differences.push_back({key, value, other});
  }
  for (const auto& [key, value] : theirs)
    if (value_in(ours, key) == "(absent)") differences.push_back({key, "(absent)", value});
  return differences;
}

}  // namespace hdp
