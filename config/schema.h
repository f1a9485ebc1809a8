#pragma once
// The training config's schema: one entry per key, in the order the effective
// config and docs/configuration.md list them, carrying where its value lives in
// Config (and with it its default, the member's initial value), a one-line doc
// and the rule its value alone must keep. The parser and --set (config.cpp), the
// "did you mean" hints, the checks (checks.cpp), the effective config
// (emit_config_yaml) and the key tables of docs/configuration.md (`trainer
// config --keys-markdown`) all read it. Rules between keys are in checks.cpp and,
// for the model, spec/model_checks.h.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"

namespace hdp {

// A key whose values are the names of an enum's values (scheduler.policy: naive).
// A name the table lacks is refused with "unknown <noun> '<name>'; choose <choices>".
struct EnumRef {
  std::function<std::string()> name;
  std::function<bool(const std::string&)> set_name;  // false: not a name of the enum
  const char* noun;
  std::string choices;  // the table's names and meanings, "a (...), b or c"
};

// A count that may be `auto` (parallel.hdp), which the job's size decides when the
// config is read for a job (load_config's job_ranks); until then `count` holds a
// stand-in for the checks and the effective config says auto.
struct AutoCountRef {
  int* count;
  bool* automatic;
};

// std::optional<int64_t>: a whole number or null (model.sliding_window).
using FieldRef = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<int64_t>*,
                              std::optional<int64_t>*, EnumRef, AutoCountRef>;

// The rule a key's value alone must keep. `problem` and `valid` make the message
// "<key>: <problem>; <valid>", where "{value}" in `problem` stands for the value as
// messages show it ("4 (default)").
struct KeyRule {
  std::string text;                            // as the docs state it: "> 0", "in [0, 1)"; empty: any value
  std::function<bool(const FieldRef&)> holds;  // empty: checked with the rules between keys (the model's)
  std::string problem;
  std::string valid;
};

struct Field {
  std::string key;
  std::function<FieldRef(Config&)> ref;
  std::string doc;  // what the key is, one line of Markdown
  KeyRule rule;
};

struct Section {
  std::string name;
  std::vector<Field> fields;
};

const std::vector<Section>& config_schema();
const Section* find_section(const std::string& name);
const Field* find_field(const Section& section, const std::string& key);
// The field of a key path ("model.num_heads") the schema has; std::logic_error otherwise.
const Field& schema_field(const std::string& path);

std::vector<std::string> section_names();
std::vector<std::string> key_names(const Section& section);

// The value as messages show it: 'naive', 128, 0.0003, [5, 3], null.
std::string value_text(const FieldRef& ref);
// The type as docs/configuration.md's Types table names it: integer, number, name, ...
std::string type_name(const FieldRef& ref);
// Writes the value as the effective config does (strings quoted, doubles with a dot).
void emit_value(YAML::Emitter& out, const FieldRef& ref);
// Converts `node` into the field's type, or throws ConfigError naming `where` and `key`.
void assign(const FieldRef& ref, const YAML::Node& node, const std::string& where, const std::string& key);

}  // namespace hdp
