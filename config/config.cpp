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
#include <numeric>
#include <sstream>
#include <system_error>
#include <utility>

#include "base/yaml_reader.h"
#include "config/checks.h"
#include "config/parser.h"
#include "config/schema.h"

namespace hdp {
namespace {

// parallel.hdp: auto, the data-parallel degree inferred from the job's size as
// Megatron-LM and torchtitan infer theirs: the training ranks over tp x pp. Without
// a job, the least degree the other keys allow (ep and scheduler.cp divide it).
void decide_auto_hdp(Config& config, int job_ranks) {
  ParallelConfig& p = config.parallel;
  if (!p.hdp_auto) return;
  if (job_ranks <= 0) {
    p.hdp = static_cast<int>(std::lcm<int64_t>(std::max(p.ep, 1), std::max<int64_t>(config.scheduler.cp, 1)));
    return;
  }
  const bool remote = config.loader.mode == LoaderMode::Remote;
  const int64_t training = job_ranks - (remote ? config.loader.servers : 0);
  const int64_t per_replica = static_cast<int64_t>(p.tp) * p.pp;
  if (training < per_replica || training % per_replica != 0) {
    const auto it = config.origins.find("parallel.hdp");
    throw_config_error(it != config.origins.end() ? it->second : config.source, "parallel.hdp",
                       "auto needs the job's " + std::to_string(training) + " training rank(s)" +
                           (remote ? " (" + std::to_string(job_ranks) + " minus loader.servers " +
                                         std::to_string(config.loader.servers) + ")"
                                   : std::string()) +
                           " to be a multiple of parallel.tp x parallel.pp = " + std::to_string(p.tp) + " x " +
                           std::to_string(p.pp) + " = " + std::to_string(per_replica),
                       "launch a multiple of " + std::to_string(per_replica) + " training ranks, or set parallel.hdp");
  }
  p.hdp = static_cast<int>(training / per_replica);
  p.hdp_auto = false;
}

// train.precision not given: bf16 on cuda (the CUDA bf16 path equals the CPU's bf16
// and runs at tensor-core speed: docs/performance.md, an H200 on 2026-11-28), fp32,
// the reference path, elsewhere. The effective config names the choice; a resumed run
// keeps its checkpoint's (run/job.h: keep_resumed_precision).
void decide_default_precision(Config& config) {
  if (config.origins.count("train.precision")) return;
  config.train.precision = config.train.device == Device::CUDA ? DType::BF16 : DType::F32;
}

Config read_config(const YamlDocument& document, const std::vector<std::string>& overrides, bool check_files,
                   int job_ranks, bool skip_retired_keys = false) {
  ConfigParser parser;
  parser.skip_retired_keys = skip_retired_keys;
  parser.source = document.source();
  parser.config.source = document.source();
  parser.read_document(document);
  for (const std::string& o : overrides) parser.apply_override(o);
  decide_auto_hdp(parser.config, job_ranks);
  decide_default_precision(parser.config);
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
  return read_config(YamlDocument::parse(yaml_text, source_name), overrides, check_files, 0);
}

Config parse_manifest_config(const std::string& yaml_text, const std::string& checkpoint) {
  return read_config(YamlDocument::parse(yaml_text, checkpoint + "/manifest.yaml (config)"), {}, /*check_files=*/false, 0,
                     /*skip_retired_keys=*/true);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, bool check_files,
                   int job_ranks) {
  return read_config(
      YamlDocument::read_file(path, "config", "pass an existing YAML file, e.g. configs/tiny-llama.yaml"), overrides,
      check_files, job_ranks);
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
  if (config.train.checkpoint_every > 0) check("train.checkpoint_dir", resolved_checkpoint_dir(config.train));
}

// Checkpoints belong to the run: under its directory unless put elsewhere.
std::string resolved_checkpoint_dir(const TrainConfig& train) {
  if (!train.checkpoint_dir.empty()) return train.checkpoint_dir;
  return (std::filesystem::path(train.run_dir) / "checkpoints").string();
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
