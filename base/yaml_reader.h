#pragma once
// The one reader of the project's YAML files: training configs, cost files,
// cluster and model files, checkpoint manifests. Typed scalars and lists,
// required and optional keys, duplicate keys refused, unknown keys refused where
// a format is strict. Every error is a ConfigError of one shape:
//   "<file>:<line>: <key.path>: <problem>; <what is valid>"
// where a document may add a remedy of its own after the last "; ".

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"

namespace hdp {

// Throws ConfigError "<where>: <key>: <problem>; <valid>"; an empty key or
// valid is left out with its separator.
[[noreturn]] void throw_config_error(const std::string& where, const std::string& key, const std::string& problem,
                                     const std::string& valid);

// "did you mean 'x'? " when one of `candidates` is within edit distance 2 of
// `given` (case-insensitive, adjacent transpositions count 1), else "".
std::string did_you_mean(const std::string& given, const std::vector<std::string>& candidates);
// "a, b, c"
std::string join_names(const std::vector<std::string>& names);

// Shortest text that reads back as the same double ("0.0003", "1e-08").
std::string format_double(double v);

// A node as messages show it: "'abc'", "the quoted string \"128\"", "a list",
// "a mapping", "nothing (null)".
std::string describe_yaml(const YAML::Node& node);

// Converts `node` into `value` or throws ConfigError at `where` naming `key`
// with what was expected and what was found. Numbers must be written plainly
// (a quoted "128" is a string) and finite; integers must fit T. A null node
// gives an empty string or list. With value_is_example the current `value` is
// shown as an example of a valid one ("write a whole number such as 128").
// T: int, int64_t, uint64_t, double, bool, std::string, std::vector<int64_t>,
// std::vector<double>, std::vector<std::string>.
template <class T>
void read_yaml_value(const YAML::Node& node, const std::string& where, const std::string& key, T& value,
                     bool value_is_example = true);

class YamlMap;

// One YAML document and the name messages give it (a file's path, "--set ...",
// a checkpoint's "manifest"). `remedy`, when given, ends every message about
// the document: what to do when the file itself is wrong.
class YamlDocument {
 public:
  // Reads and parses `path`. `kind` names the file in messages ("config",
  // "cost", "cluster"): "<path>: cannot open the cluster file (No such file or
  // directory); <open_hint>", "<path>:<line>: YAML syntax error: ...".
  static YamlDocument read_file(const std::string& path, const std::string& kind, const std::string& open_hint,
                                const std::string& remedy = "");
  static YamlDocument parse(const std::string& text, const std::string& source, const std::string& remedy = "");

  const std::string& source() const { return source_; }
  const YAML::Node& root() const { return root_; }
  // "<source>:<line>" of a node; the first line when the node has no position.
  std::string where(const YAML::Node& node) const;
  // The top level as a map; refuses anything else.
  YamlMap root_map() const;
  [[noreturn]] void fail(const std::string& where, const std::string& key, const std::string& problem,
                         const std::string& valid = "") const;
  // Throws `error` again with the remedy appended.
  [[noreturn]] void rethrow_with_remedy(const ConfigError& error) const;

 private:
  YamlDocument(std::string source, YAML::Node root, std::string remedy)
      : source_(std::move(source)), root_(std::move(root)), remedy_(std::move(remedy)) {}
  std::string source_;
  YAML::Node root_;
  std::string remedy_;
};

// One key of a map: its name, its value and "<source>:<line>" of the key.
struct YamlEntry {
  std::string key;
  YAML::Node value;
  std::string where;
};

// One mapping of a document, read key by key. Key paths in messages carry the
// map's own path ("layer.a1"); a missing key is reported at the map's header.
class YamlMap {
 public:
  // `node` must be a map (or null, an empty map) whose keys are plain scalars,
  // each given once. `path` is its key path ("" at the top level), `where` the
  // location of its header.
  YamlMap(const YamlDocument& document, YAML::Node node, std::string path, std::string where);

  // The entries in file order.
  const std::vector<YamlEntry>& entries() const { return entries_; }
  // Refuses a key outside `known`, suggesting the closest and listing them all.
  void allow_only(const std::vector<std::string>& known) const;

  bool has(const std::string& key) const;
  template <class T>
  T get(const std::string& key) const {  // required
    T value{};
    read(require(key), value, false);
    return value;
  }
  template <class T>
  T get_or(const std::string& key, T fallback) const {  // optional
    if (const YamlEntry* entry = find(key)) read(*entry, fallback, true);
    return fallback;
  }
  YamlMap map(const std::string& key) const;  // a required map
  std::optional<YamlMap> optional_map(const std::string& key) const;

  // "<source>:<line>" of the key, or of the map's header when it is absent.
  std::string where(const std::string& key) const;
  // "path.key"
  std::string path(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& problem, const std::string& valid = "") const;

 private:
  const YamlEntry& require(const std::string& key) const;
  template <class T>
  void read(const YamlEntry& entry, T& value, bool value_is_example) const {
    try {
      read_yaml_value(entry.value, entry.where, path(entry.key), value, value_is_example);
    } catch (const ConfigError& e) {
      document_.rethrow_with_remedy(e);
    }
  }
  const YamlEntry* find(const std::string& key) const;

  YamlDocument document_;
  std::vector<YamlEntry> entries_;
  std::string path_;
  std::string where_;
};

}  // namespace hdp
