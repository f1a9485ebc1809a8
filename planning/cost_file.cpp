#include "planning/cost_file.h"

#include <spdlog/fmt/fmt.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace hdp {
namespace {

constexpr const char* kFormat = "hdp-trainer cost model";
constexpr int kVersion = 1;

const char* const kRemedy = "write the file with 'trainer profile CONFIG.yaml --output FILE', or set "
                            "scheduler.cost_file to empty (derived from FLOPs) or profile (measured at start-up)";

[[noreturn]] void bad(const std::string& path, const YAML::Node& node, const std::string& key, const std::string& problem) {
  std::string where = path;
  if (node.IsDefined() && node.Mark().line >= 0) where += ":" + std::to_string(node.Mark().line + 1);
  throw ConfigError(where + ": " + key + ": " + problem + "; " + kRemedy);
}

// A YAML map read key by key, naming "section.key" in errors.
struct Reader {
  std::string path;
  YAML::Node root;

  YAML::Node section(const std::string& name) const {
    const YAML::Node n = root[name];
    if (!n) bad(path, root, name, "missing");
    if (!n.IsMap()) bad(path, n, name, "expected a map of keys");
    return n;
  }

  template <class T>
  T scalar(const YAML::Node& parent, const std::string& prefix, const std::string& key, const char* type) const {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    const YAML::Node n = parent[key];
    if (!n) bad(path, parent, name, "missing");
    if (!n.IsScalar()) bad(path, n, name, std::string("expected ") + type);
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      bad(path, n, name, std::string("expected ") + type + ", got '" + n.Scalar() + "'");
    }
  }

  double number(const YAML::Node& parent, const std::string& prefix, const std::string& key, bool positive) const {
    const double v = scalar<double>(parent, prefix, key, "a number");
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (!std::isfinite(v) || v < 0 || (positive && v == 0)) {
      bad(path, parent[key], name,
          fmt::format("{:g}", v) + (positive ? " is not a positive number" : " is not a non-negative number"));
    }
    return v;
  }

  int64_t integer(const YAML::Node& parent, const std::string& prefix, const std::string& key) const {
    const int64_t v = scalar<int64_t>(parent, prefix, key, "an integer");
    if (v <= 0) bad(path, parent[key], prefix + "." + key, std::to_string(v) + " is not a positive integer");
    return v;
  }

  std::string text(const YAML::Node& parent, const std::string& key) const {
    const YAML::Node n = parent[key];
    return n && n.IsScalar() ? n.Scalar() : std::string();
  }

  template <class T>
  std::vector<T> list(const YAML::Node& parent, const std::string& prefix, const std::string& key) const {
    const YAML::Node n = parent[key];
    if (!n) return {};
    if (!n.IsSequence()) bad(path, n, prefix + "." + key, "expected a list");
    std::vector<T> values;
    for (const YAML::Node& item : n) {
      try {
        values.push_back(item.as<T>());
      } catch (const YAML::Exception&) {
        bad(path, item, prefix + "." + key, "expected a list of numbers");
      }
    }
    return values;
  }
};

}  // namespace

void write_cost_file(const std::string& path, const CostFile& file) {
  const CostModel& c = file.cost;
  const CostProfileInfo& p = file.profiled;
  const CostFitReport& f = file.fit;
  YAML::Emitter out;
  out.SetDoublePrecision(17);
  out << YAML::Comment("Cost model of one transformer layer, written by 'trainer profile' (docs/cost-model.md).");
  out << YAML::BeginMap;
  out << YAML::Key << "format" << YAML::Value << kFormat;
  out << YAML::Key << "version" << YAML::Value << kVersion;
  out << YAML::Key << "model" << YAML::Comment("the layer shape measured; the planner refuses another");
  out << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "hidden_size" << YAML::Value << p.hidden_size;
  out << YAML::Key << "num_heads" << YAML::Value << p.num_heads;
  out << YAML::Key << "num_kv_heads" << YAML::Value << p.num_kv_heads;
  out << YAML::Key << "head_dim" << YAML::Value << p.head_dim;
  out << YAML::Key << "ffn_hidden_size" << YAML::Value << p.ffn_hidden_size;
  out << YAML::Key << "vocab_size" << YAML::Value << p.vocab_size;
  out << YAML::Key << "tp" << YAML::Value << p.tp;
  out << YAML::Key << "saved_floats_per_token" << YAML::Value << p.saved_floats_per_token;
  out << YAML::EndMap;
  out << YAML::Key << "layer" << YAML::Comment("T(s) = a1 s^2 + b1 s + g seconds; Act(s) = a2 s + b2 bytes");
  out << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "a1" << YAML::Value << c.a1;
  out << YAML::Key << "b1" << YAML::Value << c.b1;
  out << YAML::Key << "g" << YAML::Value << c.g;
  out << YAML::Key << "a2" << YAML::Value << c.a2;
  out << YAML::Key << "b2" << YAML::Value << c.b2;
  out << YAML::EndMap;
  out << YAML::Key << "embedding_seconds_per_token" << YAML::Value << c.embedding_seconds_per_token;
  out << YAML::Key << "head_seconds_per_token" << YAML::Value << c.head_seconds_per_token;
  out << YAML::Key << "copy" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "d2h_bytes_per_s" << YAML::Value << c.d2h_bytes_per_s;
  out << YAML::Key << "h2d_bytes_per_s" << YAML::Value << c.h2d_bytes_per_s;
  out << YAML::Key << "bytes" << YAML::Value << f.copy_bytes;
  out << YAML::EndMap;
  out << YAML::Key << "fit" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "lengths" << YAML::Value << YAML::Flow << f.lengths;
  out << YAML::Key << "layer_seconds" << YAML::Value << YAML::Flow << f.layer_seconds;
  out << YAML::Key << "activation_bytes" << YAML::Value << YAML::Flow << f.activation_bytes;
  out << YAML::Key << "held_out_lengths" << YAML::Value << YAML::Flow << f.held_out_lengths;
  out << YAML::Key << "held_out_max_relative_error" << YAML::Value << f.held_out_max_relative_error;
  out << YAML::Key << "held_out_mean_relative_error" << YAML::Value << f.held_out_mean_relative_error;
  out << YAML::Key << "max_relative_error" << YAML::Value << f.max_relative_error;
  out << YAML::Key << "activation_max_relative_error" << YAML::Value << f.activation_max_relative_error;
  out << YAML::Key << "head_tokens" << YAML::Value << f.head_tokens;
  out << YAML::Key << "embedding_tokens" << YAML::Value << f.embedding_tokens;
  out << YAML::EndMap;
  out << YAML::Key << "profiled" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "config" << YAML::Value << p.config;
  out << YAML::Key << "date" << YAML::Value << p.date;
  out << YAML::Key << "host" << YAML::Value << p.host;
  out << YAML::Key << "threads" << YAML::Value << p.threads;
  out << YAML::Key << "openblas_core" << YAML::Value << p.openblas_core;
  out << YAML::Key << "repeats" << YAML::Value << p.repeats;
  out << YAML::Key << "other_cpu_fraction" << YAML::Value << p.other_cpu_fraction;
  out << YAML::EndMap;
  out << YAML::EndMap;
  if (!out.good()) throw std::runtime_error("cost file " + path + ": YAML emitter error: " + out.GetLastError());

  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    if (!file) throw std::runtime_error("cannot write the cost file " + tmp);
    file << out.c_str() << "\n";
    if (!file) throw std::runtime_error("cannot write the cost file " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

CostFile read_cost_file(const std::string& path) {
  Reader r{path, {}};
  try {
    r.root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw ConfigError(path + ": cannot open the cost file; " + kRemedy);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg + "; " + kRemedy);
  }
  if (!r.root.IsMap()) throw ConfigError(path + ": not a cost file (expected a YAML map); " + kRemedy);
  const std::string format = r.scalar<std::string>(r.root, "", "format", "a string");
  if (format != kFormat) bad(path, r.root["format"], "format", "'" + format + "' is not '" + kFormat + "'");
  const int64_t version = r.scalar<int64_t>(r.root, "", "version", "an integer");
  if (version != kVersion) {
    bad(path, r.root["version"], "version",
        "version " + std::to_string(version) + " is not supported (this trainer reads " + std::to_string(kVersion) + ")");
  }

  CostFile file;
  CostProfileInfo& p = file.profiled;
  const YAML::Node model = r.section("model");
  p.hidden_size = r.integer(model, "model", "hidden_size");
  p.num_heads = r.integer(model, "model", "num_heads");
  p.num_kv_heads = r.integer(model, "model", "num_kv_heads");
  p.head_dim = r.integer(model, "model", "head_dim");
  p.ffn_hidden_size = r.integer(model, "model", "ffn_hidden_size");
  p.vocab_size = r.integer(model, "model", "vocab_size");
  p.tp = r.integer(model, "model", "tp");
  p.saved_floats_per_token = r.integer(model, "model", "saved_floats_per_token");

  CostModel& c = file.cost;
  const YAML::Node layer = r.section("layer");
  c.a1 = r.number(layer, "layer", "a1", false);
  c.b1 = r.number(layer, "layer", "b1", false);
  c.g = r.number(layer, "layer", "g", false);
  if (c.a1 == 0 && c.b1 == 0 && c.g == 0) bad(path, layer, "layer", "a1, b1 and g are all 0 (no compute time)");
  c.a2 = r.number(layer, "layer", "a2", true);
  c.b2 = r.number(layer, "layer", "b2", false);
  c.embedding_seconds_per_token = r.number(r.root, "", "embedding_seconds_per_token", false);
  c.head_seconds_per_token = r.number(r.root, "", "head_seconds_per_token", false);
  const YAML::Node copy = r.section("copy");
  c.d2h_bytes_per_s = r.number(copy, "copy", "d2h_bytes_per_s", true);
  c.h2d_bytes_per_s = r.number(copy, "copy", "h2d_bytes_per_s", true);

  // Informational: how the numbers were obtained.
  CostFitReport& f = file.fit;
  if (copy["bytes"]) f.copy_bytes = r.integer(copy, "copy", "bytes");
  if (const YAML::Node fit = r.root["fit"]) {
    if (!fit.IsMap()) bad(path, fit, "fit", "expected a map of keys");
    f.lengths = r.list<int64_t>(fit, "fit", "lengths");
    f.layer_seconds = r.list<double>(fit, "fit", "layer_seconds");
    f.activation_bytes = r.list<double>(fit, "fit", "activation_bytes");
    f.held_out_lengths = r.list<int64_t>(fit, "fit", "held_out_lengths");
    auto optional_number = [&](const char* key, double& value) {
      if (fit[key]) value = r.number(fit, "fit", key, false);
    };
    optional_number("held_out_max_relative_error", f.held_out_max_relative_error);
    optional_number("held_out_mean_relative_error", f.held_out_mean_relative_error);
    optional_number("max_relative_error", f.max_relative_error);
    optional_number("activation_max_relative_error", f.activation_max_relative_error);
    if (fit["head_tokens"]) f.head_tokens = r.integer(fit, "fit", "head_tokens");
    if (fit["embedding_tokens"]) f.embedding_tokens = r.integer(fit, "fit", "embedding_tokens");
    if (!f.layer_seconds.empty() && f.layer_seconds.size() != f.lengths.size())
      bad(path, fit, "fit.layer_seconds", "has " + std::to_string(f.layer_seconds.size()) + " entries for " +
                                              std::to_string(f.lengths.size()) + " lengths");
  }
  if (const YAML::Node prof = r.root["profiled"]) {
    if (!prof.IsMap()) bad(path, prof, "profiled", "expected a map of keys");
    p.config = r.text(prof, "config");
    p.date = r.text(prof, "date");
    p.host = r.text(prof, "host");
    p.openblas_core = r.text(prof, "openblas_core");
    if (prof["threads"]) p.threads = r.integer(prof, "profiled", "threads");
    if (prof["repeats"]) p.repeats = r.integer(prof, "profiled", "repeats");
    if (prof["other_cpu_fraction"])
      p.other_cpu_fraction = r.scalar<double>(prof, "profiled", "other_cpu_fraction", "a number");
  }
  return file;
}

}  // namespace hdp
