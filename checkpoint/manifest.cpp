#include "checkpoint/manifest.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "base/yaml_reader.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

std::string emit_manifest(const Manifest& m, bool literal_config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "format_version" << YAML::Value << m.format_version;
  out << YAML::Key << "step" << YAML::Value << m.progress.step;
  out << YAML::Key << "sampler" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "epoch" << YAML::Value << m.progress.sampler.epoch;
  out << YAML::Key << "cursor" << YAML::Value << m.progress.sampler.cursor;
  out << YAML::Key << "document_offset" << YAML::Value << m.progress.sampler.document_offset;
  out << YAML::EndMap;
  out << YAML::Key << "train_seed" << YAML::Value << m.progress.train_seed;
  out << YAML::Key << "data_seed" << YAML::Value << m.progress.data_seed;
  out << YAML::Key << "skipped_steps" << YAML::Value << m.progress.skipped_steps;
  out << YAML::Key << "rollbacks" << YAML::Value << m.progress.rollbacks;
  out << YAML::Key << "checkpoints_deferred" << YAML::Value << m.progress.checkpoints_deferred;
  // Three numbers per skipped batch: epoch, cursor, document_offset of its start.
  out << YAML::Key << "skipped_batches" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const SamplerState& s : m.progress.skipped_batches) {
    out << static_cast<int64_t>(s.epoch) << s.cursor << s.document_offset;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "loss_window" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double loss : m.progress.loss_window) out << loss;
  out << YAML::EndSeq;
  out << YAML::Key << "grad_norm_window" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double norm : m.progress.grad_norm_window) out << norm;
  out << YAML::EndSeq;
  out << YAML::Key << "guard_confirmed" << YAML::Value << m.progress.guard_confirmed;
  if (!m.suspect.empty()) out << YAML::Key << "suspect" << YAML::Value << m.suspect;
  if (const auto& run = m.progress.lr_schedule) {
    const LearningRateSchedule& s = run->schedule;
    out << YAML::Key << "lr_schedule" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "schedule" << YAML::Value << enum_name(kLrScheduleNames, s.kind);
    out << YAML::Key << "lr" << YAML::Value << format_double(s.lr);
    out << YAML::Key << "min_lr" << YAML::Value << format_double(s.min_lr);
    out << YAML::Key << "warmup_steps" << YAML::Value << s.warmup_steps;
    out << YAML::Key << "decay_steps" << YAML::Value << s.decay_steps;
    out << YAML::Key << "decay_fraction" << YAML::Value << format_double(s.decay_fraction);
    out << YAML::Key << "steps" << YAML::Value << run->steps;
    out << YAML::EndMap;
  }
  out << YAML::Key << "layout" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "tp" << YAML::Value << m.degrees.tp;
  out << YAML::Key << "pp" << YAML::Value << m.degrees.pp;
  out << YAML::Key << "hdp" << YAML::Value << m.degrees.hdp;
  out << YAML::EndMap;
  out << YAML::Key << "parts" << YAML::Value << YAML::BeginSeq;
  for (const std::string& p : m.parts) out << p;
  out << YAML::EndSeq;
  if (!m.tokenizer.empty()) out << YAML::Key << "tokenizer" << YAML::Value << m.tokenizer;
  out << YAML::Key << "config" << YAML::Value;
  if (literal_config) out << YAML::Literal;
  else out << YAML::DoubleQuoted;
  out << m.config;
  out << YAML::EndMap;
  if (!out.good()) throw CheckpointError(std::string("writing the checkpoint manifest: ") + out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

Manifest read_manifest_map(const YamlMap& root) {
  Manifest m;
  m.format_version = root.get<int64_t>("format_version");
  if (m.format_version < kOldestReadableCheckpointFormat || m.format_version > kCheckpointFormatVersion)
    root.fail("format_version", std::to_string(m.format_version) + " is not readable",
              "this build reads format_version " + std::to_string(kOldestReadableCheckpointFormat) + " to " +
                  std::to_string(kCheckpointFormatVersion));
  m.progress.step = root.get<int64_t>("step");
  const YamlMap sampler = root.map("sampler");
  m.progress.sampler.epoch = sampler.get<uint64_t>("epoch");
  m.progress.sampler.cursor = sampler.get<int64_t>("cursor");
  m.progress.sampler.document_offset = sampler.get<int64_t>("document_offset");
  m.progress.train_seed = root.get<uint64_t>("train_seed");
  m.progress.data_seed = root.get<uint64_t>("data_seed");
  // Absent from manifests written before the numerical guard existed.
  m.progress.skipped_steps = root.get_or<int64_t>("skipped_steps", 0);
  // Absent from manifests written before rollbacks: none, and an empty window.
  m.progress.rollbacks = root.get_or<int64_t>("rollbacks", 0);
  // Absent from manifests written before checkpoints were deferred: none.
  m.progress.checkpoints_deferred = root.get_or<int64_t>("checkpoints_deferred", 0);
  const auto skipped = root.get_or<std::vector<int64_t>>("skipped_batches", {});
  if (skipped.size() % 3 != 0) {
    root.fail("skipped_batches", "holds " + std::to_string(skipped.size()) + " numbers",
              "three per skipped batch: epoch, cursor, document_offset");
  }
  for (size_t i = 0; i < skipped.size(); i += 3) {
    m.progress.skipped_batches.push_back({static_cast<uint64_t>(skipped[i]), skipped[i + 1], skipped[i + 2]});
  }
  m.progress.loss_window = root.get_or<std::vector<double>>("loss_window", {});
  m.progress.grad_norm_window = root.get_or<std::vector<double>>("grad_norm_window", {});
  // Absent from manifests written before checkpoints were confirmed: trusted as before.
  m.progress.guard_confirmed = root.get_or<bool>("guard_confirmed", true);
  m.suspect = root.get_or<std::string>("suspect", "");
  // Absent from manifests written before the schedule was recorded.
  if (const std::optional<YamlMap> run = root.optional_map("lr_schedule")) {
    RunSchedule& r = m.progress.lr_schedule.emplace();
    const std::string kind = run->get<std::string>("schedule");
    const std::optional<LrScheduleKind> parsed = enum_value(kLrScheduleNames, kind);
    if (!parsed) run->fail("schedule", "unknown schedule '" + kind + "'", "choose " + enum_choices(kLrScheduleNames));
    r.schedule.kind = *parsed;
    r.schedule.lr = run->get<double>("lr");
    r.schedule.min_lr = run->get<double>("min_lr");
    r.schedule.warmup_steps = run->get<int64_t>("warmup_steps");
    r.schedule.decay_steps = run->get<int64_t>("decay_steps");
    r.schedule.decay_fraction = run->get<double>("decay_fraction");
    r.steps = run->get<int64_t>("steps");
  }
  const YamlMap layout = root.map("layout");
  m.degrees.tp = layout.get<int>("tp");
  m.degrees.pp = layout.get<int>("pp");
  m.degrees.hdp = layout.get<int>("hdp");
  m.parts = root.get<std::vector<std::string>>("parts");
  if (m.parts.empty()) root.fail("parts", "the manifest lists no parts");
  for (const std::string& p : m.parts)
    if (p.empty() || p.find('/') != std::string::npos || p == "." || p == "..")
      root.fail("parts", "the manifest lists a bad part name '" + p + "'");
  // Absent from manifests written before the tokenizer travelled with checkpoints.
  m.tokenizer = root.get_or<std::string>("tokenizer", "");
  m.config = root.get<std::string>("config");
  return m;
}

// A broken manifest is a broken checkpoint: the reader's ConfigError (file:line,
// key, problem) becomes a CheckpointError with the same message.
Manifest parse_manifest(const std::string& text, const std::string& what) {
  try {
    return read_manifest_map(YamlDocument::parse(text, what).root_map());
  } catch (const ConfigError& e) {
    throw CheckpointError(e.what());
  }
}

// The manifest as YAML: the config as a literal block when that keeps it exactly,
// else double-quoted (e.g. leading indentation or trailing blank lines: a quoted
// scalar keeps them).
std::string manifest_text(const Manifest& m, const std::string& where) {
  std::string text = emit_manifest(m, true);
  bool exact = false;
  try {
    exact = parse_manifest(text, "manifest").config == m.config;
  } catch (const CheckpointError&) {
  }
  if (!exact) {
    text = emit_manifest(m, false);
    if (parse_manifest(text, "manifest").config != m.config) {
      throw CheckpointError(where + ": the config text does not survive YAML quoting");
    }
  }
  return text;
}

// FILE through FILE.tmp and a rename.
void write_text_file(const std::string& file, const std::string& text) {
  const std::string tmp = file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw CheckpointError(tmp + ": cannot write");
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) throw CheckpointError(file + ": renaming " + tmp + " failed: " + ec.message());
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  const std::string file = (fs::path(path) / kManifestFile).string();
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw CheckpointError(path + ": no such checkpoint directory");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CheckpointError(path + ": no " + kManifestFile + " (not a complete checkpoint)");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_manifest(text, file);
}

void write_manifest(const std::string& checkpoint, const Manifest& manifest) {
  write_text_file((fs::path(checkpoint) / kManifestFile).string(), manifest_text(manifest, checkpoint));
}

std::string checkpoint_config(const std::string& checkpoint) { return read_manifest(checkpoint).config; }

}  // namespace hdp
