#include "base/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>
#include <type_traits>

#include "base/utf8.h"

namespace hdp {
namespace {

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                                  std::tolower(static_cast<unsigned char>(b[j - 1]))
                              ? 0
                              : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

// ---------------------------------------------------------------------------
// Scalar conversion

// A scalar written without quotes (quoted scalars are strings, never numbers).
bool plain_scalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string unquote_hint(const YAML::Node& node) {
  return node.IsScalar() && node.Tag() == "!" ? " (remove the quotes)" : "";
}

template <class Int>
bool parse_integer(std::string text, Int& out, bool& out_of_range) {
  out_of_range = false;
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  if (text.empty()) return false;
  auto result = std::from_chars(text.data(), text.data() + text.size(), out);
  if (result.ec == std::errc::result_out_of_range && result.ptr == text.data() + text.size()) {
    out_of_range = true;
    return false;
  }
  return result.ec == std::errc() && result.ptr == text.data() + text.size();
}

bool parse_double(std::string text, double& out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  if (text.empty()) return false;
  auto result = std::from_chars(text.data(), text.data() + text.size(), out);
  return result.ec == std::errc() && result.ptr == text.data() + text.size() && std::isfinite(out);
}

// " such as <example>" when the value serves as an example, else "".
template <class T>
std::string such_as(const T& value, bool value_is_example) {
  if (!value_is_example) return "";
  if constexpr (std::is_same_v<T, double>) return " such as " + format_double(value);
  else return " such as " + std::to_string(value);
}

template <class Int>
void read_integer(const YAML::Node& node, const std::string& where, const std::string& key, Int& value,
                  bool value_is_example) {
  Int v = 0;
  bool out_of_range = false;
  if (plain_scalar(node) && parse_integer(node.Scalar(), v, out_of_range)) {
    value = v;
    return;
  }
  const bool is_unsigned = std::is_unsigned_v<Int>;
  if (out_of_range)
    throw_config_error(where, key, node.Scalar() + " is out of range",
                       "the value must fit a " + std::to_string(8 * sizeof(Int)) + "-bit " +
                           (is_unsigned ? "unsigned" : "signed") + " integer");
  throw_config_error(where, key,
                     std::string("expected ") + (is_unsigned ? "a non-negative integer" : "an integer") + ", got " +
                         describe_yaml(node) + unquote_hint(node),
                     "write a whole number" + such_as(value, value_is_example));
}

void read_double(const YAML::Node& node, const std::string& where, const std::string& key, double& value,
                 bool value_is_example) {
  double v = 0;
  if (!plain_scalar(node) || !parse_double(node.Scalar(), v))
    throw_config_error(where, key, "expected a number, got " + describe_yaml(node) + unquote_hint(node),
                       "write a finite number" + such_as(value, value_is_example));
  value = v;
}

void read_bool(const YAML::Node& node, const std::string& where, const std::string& key, bool& value) {
  bool v = false;
  if (!plain_scalar(node) || !YAML::convert<bool>::decode(node, v))
    throw_config_error(where, key, "expected true or false, got " + describe_yaml(node) + unquote_hint(node),
                       "write true or false");
  value = v;
}

void read_string(const YAML::Node& node, const std::string& where, const std::string& key, std::string& value,
                 bool value_is_example) {
  if (node.IsNull()) value = "";
  else if (node.IsScalar()) value = node.Scalar();
  else
    throw_config_error(where, key, "expected a string, got " + describe_yaml(node),
                       value_is_example ? "write a single value such as \"" + value + "\"" : "write a single value");
}

template <class T>
void read_list(const YAML::Node& node, const std::string& where, const std::string& key, std::vector<T>& values) {
  const char* kind = std::is_same_v<T, std::string> ? "strings" : std::is_same_v<T, double> ? "numbers" : "integers";
  const char* example = std::is_same_v<T, std::string> ? "write e.g. [a, b]" : "write e.g. [3, 5]";
  values.clear();
  if (node.IsNull()) return;
  if (!node.IsSequence())
    throw_config_error(where, key, std::string("expected a list of ") + kind + ", got " + describe_yaml(node), example);
  for (const YAML::Node& item : node) {
    T v{};
    try {
      read_yaml_value(item, where, key, v, false);
    } catch (const ConfigError&) {
      throw_config_error(where, key, std::string("expected a list of ") + kind + ", found " + describe_yaml(item) +
                                         " in it",
                         example);
    }
    values.push_back(v);
  }
}

}  // namespace

[[noreturn]] void throw_config_error(const std::string& where, const std::string& key, const std::string& problem,
                                     const std::string& valid) {
  std::string message = where + ": ";
  if (!key.empty()) message += key + ": ";
  message += problem;
  if (!valid.empty()) message += "; " + valid;
  throw ConfigError(message);
}

std::string did_you_mean(const std::string& given, const std::vector<std::string>& candidates) {
  size_t best = 3;
  std::string best_name;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(given, c);
    if (d < best) {
      best = d;
      best_name = c;
    }
  }
  return best_name.empty() ? "" : "did you mean '" + best_name + "'? ";
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

std::string format_double(double v) {
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
  return std::string(buf, result.ptr);
}

std::string describe_yaml(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Scalar:
      return node.Tag() == "!" ? "the quoted string \"" + node.Scalar() + "\"" : "'" + node.Scalar() + "'";
    default: return "nothing";
  }
}

template <class T>
void read_yaml_value(const YAML::Node& node, const std::string& where, const std::string& key, T& value,
                     bool value_is_example) {
  if constexpr (std::is_same_v<T, bool>) read_bool(node, where, key, value);
  else if constexpr (std::is_same_v<T, double>) read_double(node, where, key, value, value_is_example);
  else if constexpr (std::is_same_v<T, std::string>) read_string(node, where, key, value, value_is_example);
  else if constexpr (std::is_integral_v<T>) read_integer(node, where, key, value, value_is_example);
  else read_list(node, where, key, value);
}

template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, int&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, int64_t&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, uint64_t&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, double&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, bool&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, std::string&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, std::vector<int64_t>&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, std::vector<double>&, bool);
template void read_yaml_value(const YAML::Node&, const std::string&, const std::string&, std::vector<std::string>&,
                              bool);

// ---------------------------------------------------------------------------
// Documents

YamlDocument YamlDocument::read_file(const std::string& path, const std::string& kind, const std::string& open_hint,
                                     const std::string& remedy) {
  const YamlDocument file(path, YAML::Node(), remedy);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    file.fail(path, "", "is a directory, not a " + kind + " file", open_hint);
  std::ifstream in(path, std::ios::binary);
  if (!in) file.fail(path, "", "cannot open the " + kind + " file (" + std::strerror(errno) + ")", open_hint);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) file.fail(path, "", "cannot read the " + kind + " file", "check the file's permissions");
  return parse(text.str(), path, remedy);
}

YamlDocument YamlDocument::parse(const std::string& text, const std::string& source, const std::string& remedy) {
  const YamlDocument document(source, YAML::Node(), remedy);
  // yaml-cpp takes UTF-16 and UTF-32 by their byte order mark and any other bytes
  // one by one, so a NUL or a Latin-1 byte comes out as a puzzling syntax error or
  // a garbled value. A config is UTF-8 text: the first byte that is not is named.
  const auto starts_with = [&](const char* mark, size_t n) { return text.size() >= n && text.compare(0, n, mark, n) == 0; };
  if (starts_with("\xff\xfe", 2) || starts_with("\xfe\xff", 2) || starts_with("\0\0\xfe\xff", 4)) {
    document.fail(source + ":1", "", "the file is UTF-16 or UTF-32 (it starts with a byte order mark), not UTF-8",
                  "save it as UTF-8 text, e.g. iconv -f UTF-16 -t UTF-8");
  }
  Utf8Checker utf8;
  int64_t line = 1, line_start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    const bool end = i == text.size();
    const auto b = end ? 0 : static_cast<unsigned char>(text[i]);
    if (!end && b == 0) {
      document.fail(source + ":" + std::to_string(line), "",
                    "a NUL byte at column " + std::to_string(static_cast<int64_t>(i) - line_start + 1) +
                        ": this is not a text file",
                    "a config is UTF-8 text; check that this is the file meant");
    }
    if (end ? utf8.finish() : utf8.next(b, static_cast<int64_t>(i))) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned char>(text[utf8.first_invalid()]));
      document.fail(source + ":" + std::to_string(line), "",
                    "the byte " + std::string(hex) + " at column " +
                        std::to_string(utf8.first_invalid() - line_start + 1) + " is not UTF-8 text",
                    "save the file as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8), or write the character with an escape "
                    "in a double-quoted string");
    }
    if (!end && b == '\n') {
      ++line;
      line_start = static_cast<int64_t>(i) + 1;
    }
  }
  try {
    return YamlDocument(source, YAML::Load(text), remedy);
  } catch (const YAML::ParserException& e) {
    const std::string line = std::to_string(e.mark.line + 1);
    document.fail(source + ":" + line, "", "YAML syntax error: " + e.msg,
                  "fix the YAML at line " + line + ", column " + std::to_string(e.mark.column + 1));
  } catch (const YAML::Exception& e) {
    document.fail(source, "", "cannot read YAML: " + e.msg, "fix the YAML syntax");
  }
}

std::string YamlDocument::where(const YAML::Node& node) const {
  const YAML::Mark mark = node.Mark();
  return source_ + ":" + std::to_string(mark.is_null() ? 1 : mark.line + 1);
}

YamlMap YamlDocument::root_map() const {
  if (!root_.IsMap() && !root_.IsNull())
    fail(where(root_), "(top level)", "expected a mapping of keys, got " + describe_yaml(root_));
  return YamlMap(*this, root_, "", source_);
}

void YamlDocument::fail(const std::string& where, const std::string& key, const std::string& problem,
                        const std::string& valid) const {
  std::string hint = valid;
  if (!remedy_.empty()) hint += (hint.empty() ? "" : "; ") + remedy_;
  throw_config_error(where, key, problem, hint);
}

void YamlDocument::rethrow_with_remedy(const ConfigError& error) const {
  if (remedy_.empty()) throw error;
  throw ConfigError(std::string(error.what()) + "; " + remedy_);
}

// ---------------------------------------------------------------------------
// Maps

YamlMap::YamlMap(const YamlDocument& document, YAML::Node node, std::string path, std::string where)
    : document_(document), path_(std::move(path)), where_(std::move(where)) {
  if (node.IsNull()) return;
  if (!node.IsMap()) document_.fail(where_, path_, "expected a mapping of keys, got " + describe_yaml(node));
  std::map<std::string, std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;
    const std::string at = key.Mark().is_null() ? where_ : document_.where(key);
    if (!key.IsScalar())
      document_.fail(at, path_.empty() ? "(top level)" : path_, "keys must be plain words, got " + describe_yaml(key));
    const std::string name = key.Scalar();
    if (seen.count(name))
      document_.fail(at, this->path(name), "key given twice (first at " + seen[name] + ")", "keep only one");
    seen[name] = at;
    entries_.push_back({name, it->second, at});
  }
}

void YamlMap::allow_only(const std::vector<std::string>& known) const {
  for (const YamlEntry& entry : entries_) {
    if (std::find(known.begin(), known.end(), entry.key) != known.end()) continue;
    document_.fail(entry.where, path(entry.key), "unknown key",
                   did_you_mean(entry.key, known) + "valid keys" + (path_.empty() ? "" : " in " + path_) + ": " +
                       join_names(known));
  }
}

const YamlEntry* YamlMap::find(const std::string& key) const {
  for (const YamlEntry& entry : entries_)
    if (entry.key == key) return &entry;
  return nullptr;
}

bool YamlMap::has(const std::string& key) const { return find(key) != nullptr; }

const YamlEntry& YamlMap::require(const std::string& key) const {
  const YamlEntry* entry = find(key);
  if (!entry) fail(key, "required key is missing");
  return *entry;
}

YamlMap YamlMap::map(const std::string& key) const {
  const YamlEntry& entry = require(key);
  if (!entry.value.IsMap()) fail(key, "expected a mapping of keys, got " + describe_yaml(entry.value));
  return YamlMap(document_, entry.value, path(key), entry.where);
}

std::optional<YamlMap> YamlMap::optional_map(const std::string& key) const {
  const YamlEntry* entry = find(key);
  if (!entry) return std::nullopt;
  return YamlMap(document_, entry->value, path(key), entry->where);
}

std::string YamlMap::where(const std::string& key) const {
  const YamlEntry* entry = find(key);
  return entry ? entry->where : where_;
}

std::string YamlMap::path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

void YamlMap::fail(const std::string& key, const std::string& problem, const std::string& valid) const {
  document_.fail(where(key), path(key), problem, valid);
}

}  // namespace hdp
