#include "planning/cost_file.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "base/yaml_reader.h"

namespace hdp {
namespace {

constexpr const char* kFormat = "hdp-trainer cost model";
constexpr int kVersion = 1;

const char* const kRemedy = "write the file with 'trainer profile CONFIG.yaml --output FILE', or set "
                            "scheduler.cost_file to empty (derived from FLOPs) or profile (measured at start-up)";

// A required number that is not negative, and not 0 when `positive`.
double number(const YamlMap& map, const std::string& key, bool positive) {
  const double v = map.get<double>(key);
  if (v < 0 || (positive && v == 0))
    map.fail(key, format_double(v) + (positive ? " is not a positive number" : " is not a non-negative number"));
  return v;
}

double optional_number(const YamlMap& map, const std::string& key, double fallback) {
  return map.has(key) ? number(map, key, false) : fallback;
}

int64_t positive_integer(const YamlMap& map, const std::string& key) {
  const int64_t v = map.get<int64_t>(key);
  if (v <= 0) map.fail(key, std::to_string(v) + " is not a positive integer");
  return v;
}

int64_t optional_positive_integer(const YamlMap& map, const std::string& key, int64_t fallback) {
  return map.has(key) ? positive_integer(map, key) : fallback;
}

// model: the layer shape measured.
CostProfileInfo read_measured_shape(const YamlMap& model) {
  CostProfileInfo p;
  p.hidden_size = positive_integer(model, "hidden_size");
  p.num_heads = positive_integer(model, "num_heads");
  p.num_kv_heads = positive_integer(model, "num_kv_heads");
  p.head_dim = positive_integer(model, "head_dim");
  p.ffn_hidden_size = positive_integer(model, "ffn_hidden_size");
  p.vocab_size = positive_integer(model, "vocab_size");
  p.tp = positive_integer(model, "tp");
  p.saved_floats_per_token = positive_integer(model, "saved_floats_per_token");
  // Absent in files of models without a window.
  p.sliding_window = optional_positive_integer(model, "sliding_window", 0);
  return p;
}

// layer, the per-token seconds of the embedding and the head, copy: the coefficients.
CostModel read_cost_model(const YamlMap& root) {
  CostModel c;
  const YamlMap layer = root.map("layer");
  c.a1 = number(layer, "a1", false);
  c.b1 = number(layer, "b1", false);
  c.g = number(layer, "g", false);
  if (c.a1 == 0 && c.b1 == 0 && c.g == 0) root.fail("layer", "a1, b1 and g are all 0 (no compute time)");
  c.a2 = number(layer, "a2", true);
  c.b2 = number(layer, "b2", false);
  c.embedding_seconds_per_token = number(root, "embedding_seconds_per_token", false);
  c.head_seconds_per_token = number(root, "head_seconds_per_token", false);
  const YamlMap copy = root.map("copy");
  c.d2h_bytes_per_s = number(copy, "d2h_bytes_per_s", true);
  c.h2d_bytes_per_s = number(copy, "h2d_bytes_per_s", true);
  return c;
}

// fit: the measurements behind the coefficients (informational).
CostFitReport read_fit(const YamlMap& fit, CostFitReport f) {
  f.lengths = fit.get_or<std::vector<int64_t>>("lengths", {});
  f.layer_seconds = fit.get_or<std::vector<double>>("layer_seconds", {});
  f.activation_bytes = fit.get_or<std::vector<double>>("activation_bytes", {});
  f.held_out_lengths = fit.get_or<std::vector<int64_t>>("held_out_lengths", {});
  f.held_out_max_relative_error = optional_number(fit, "held_out_max_relative_error", 0);
  f.held_out_mean_relative_error = optional_number(fit, "held_out_mean_relative_error", 0);
  f.max_relative_error = optional_number(fit, "max_relative_error", 0);
  f.activation_max_relative_error = optional_number(fit, "activation_max_relative_error", 0);
  f.head_tokens = optional_positive_integer(fit, "head_tokens", 0);
  f.embedding_tokens = optional_positive_integer(fit, "embedding_tokens", 0);
  if (!f.layer_seconds.empty() && f.layer_seconds.size() != f.lengths.size())
    fit.fail("layer_seconds", "has " + std::to_string(f.layer_seconds.size()) + " entries for " +
                                  std::to_string(f.lengths.size()) + " lengths");
  return f;
}

// profiled: where and how the numbers were measured (informational).
void read_provenance(const YamlMap& profiled, CostProfileInfo& p) {
  p.config = profiled.get_or<std::string>("config", "");
  p.date = profiled.get_or<std::string>("date", "");
  p.host = profiled.get_or<std::string>("host", "");
  // Files written before the switch to oneDNN named only the OpenBLAS kernel family.
  p.gemm = profiled.get_or<std::string>("gemm", profiled.get_or<std::string>("openblas_core", ""));
  p.threads = optional_positive_integer(profiled, "threads", 0);
  p.repeats = optional_positive_integer(profiled, "repeats", 0);
  p.other_cpu_fraction = profiled.get_or<double>("other_cpu_fraction", -1);
}

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
  if (p.sliding_window > 0) out << YAML::Key << "sliding_window" << YAML::Value << p.sliding_window;
  out << YAML::EndMap;
  out << YAML::Key << "layer" << YAML::Comment("T(s) = a1 s^2 + b1 s + g seconds (s^2: attention_term under a window); Act(s) = a2 s + b2 bytes");
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
  out << YAML::Key << "gemm" << YAML::Value << p.gemm;
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
  const YamlMap root = YamlDocument::read_file(path, "cost", "", kRemedy).root_map();
  const std::string format = root.get<std::string>("format");
  if (format != kFormat) root.fail("format", "'" + format + "' is not '" + kFormat + "'");
  const int64_t version = root.get<int64_t>("version");
  if (version != kVersion)
    root.fail("version", "version " + std::to_string(version) + " is not supported (this trainer reads " +
                             std::to_string(kVersion) + ")");
  CostFile file;
  file.profiled = read_measured_shape(root.map("model"));
  file.cost = read_cost_model(root);
  // The fit's s^2 term is the attention term under the measured window (cost_model.h).
  file.cost.window = file.profiled.sliding_window;
  file.fit.copy_bytes = optional_positive_integer(root.map("copy"), "bytes", 0);
  if (const std::optional<YamlMap> fit = root.optional_map("fit")) file.fit = read_fit(*fit, file.fit);
  if (const std::optional<YamlMap> profiled = root.optional_map("profiled")) read_provenance(*profiled, file.profiled);
  return file;
}

}  // namespace hdp
