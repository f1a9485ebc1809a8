// ConfigParser (config/parser.h): YAML documents, sections and --set overrides
// read key by key through the schema, each error naming where and which key.

#include "config/parser.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "config/schema.h"

namespace hdp {
namespace {

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

// Keys this build no longer reads, with what replaced them: a config written for an
// earlier build is refused with the way to say it now.
struct RetiredKey {
  const char* path;
  const char* replacement;
};
constexpr RetiredKey kRetiredKeys[] = {
    {"train.checkpoint_when_busy",
     "it was replaced by train.checkpoint_budget: `wait` is `checkpoint_budget: 0`; `defer` is the default budget "
     "(0.02), which spaces checkpoints by their measured cost"},
};

// `other_keys`: keys the document allows beside the section's (a model file's name).
// Whether `section.key` is one of kRetiredKeys.
bool is_retired(const Section& section, const std::string& key) {
  for (const RetiredKey& retired : kRetiredKeys)
    if (section.name + "." + key == retired.path) return true;
  return false;
}

[[noreturn]] void unknown_key(const std::string& where, const Section& section, const std::string& key,
                              const std::vector<std::string>& other_keys = {}) {
  for (const RetiredKey& retired : kRetiredKeys) {
    if (section.name + "." + key == retired.path) {
      throw_config_error(where, retired.path, "this key is no longer read", retired.replacement);
    }
  }
  std::vector<std::string> valid = key_names(section);
  valid.insert(valid.end(), other_keys.begin(), other_keys.end());
  throw_config_error(where, section.name + "." + key, "unknown key in section '" + section.name + "'",
                     did_you_mean(key, valid) + "valid keys in " + section.name + ": " + join_names(valid));
}

}  // namespace

void ConfigParser::read_document(const YamlDocument& document) {
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

void ConfigParser::read_section(const YamlDocument& document, const Section& section, const YamlEntry& header) {
  if (header.value.IsNull()) return;
  if (!header.value.IsMap())
    throw_config_error(header.where, section.name, "expected a mapping of keys, got " + describe_yaml(header.value),
                       "valid keys in " + section.name + ": " + join_names(key_names(section)));
  read_keys(YamlMap(document, header.value, section.name, header.where), section);
}

void ConfigParser::read_keys(const YamlMap& keys, const Section& section, const std::vector<std::string>& other_keys) {
  for (const YamlEntry& entry : keys.entries()) {
    if (std::find(other_keys.begin(), other_keys.end(), entry.key) != other_keys.end()) continue;
    const Field* f = find_field(section, entry.key);
    if (!f && skip_retired_keys && is_retired(section, entry.key)) continue;
    if (!f) unknown_key(entry.where, section, entry.key, other_keys);
    const std::string path = section.name + "." + entry.key;
    assign(f->ref(config), entry.value, entry.where, path);  // at the key's line, also for values on later lines
    config.origins[path] = entry.where;
  }
}

void ConfigParser::apply_override(const std::string& text) {
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

}  // namespace hdp
