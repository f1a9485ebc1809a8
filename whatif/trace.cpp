#include "whatif/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "base/json_writer.h"

namespace hdp {

uint32_t Trace::op_type(std::string_view name) {
  const auto [it, added] = op_index_.try_emplace(std::string(name), static_cast<uint32_t>(op_names.size()));
  if (added) op_names.emplace_back(name);
  return it->second;
}

int64_t Trace::group_id(const std::string& name) {
  const auto [it, added] = group_index_.try_emplace(name, next_group_);
  if (added) ++next_group_;
  return it->second;
}

namespace {

[[noreturn]] void fail(const std::string& path, size_t line, const std::string& problem) {
  throw TraceError(path + ":" + std::to_string(line) + ": " + problem);
}

int64_t integer_field(const nlohmann::json& j, const char* key, int64_t minimum, const std::string& path,
                      size_t line, std::optional<int64_t> fallback = std::nullopt) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (fallback) return *fallback;
    fail(path, line, std::string("missing field \"") + key + "\"");
  }
  if (!it->is_number_integer()) fail(path, line, std::string("\"") + key + "\" must be an integer, not " + it->dump());
  const int64_t v = it->get<int64_t>();
  if (v < minimum) {
    fail(path, line, std::string("\"") + key + "\" is " + std::to_string(v) + "; it must be at least " +
                         std::to_string(minimum));
  }
  return v;
}

double time_field(const nlohmann::json& j, const char* key, const std::string& path, size_t line) {
  const auto it = j.find(key);
  if (it == j.end()) fail(path, line, std::string("missing field \"") + key + "\"");
  if (!it->is_number()) fail(path, line, std::string("\"") + key + "\" must be a number, not " + it->dump());
  const double v = it->get<double>();
  if (!std::isfinite(v)) fail(path, line, std::string("\"") + key + "\" is not finite");
  return v;
}

}  // namespace

void read_trace_file(const std::string& path, Trace& into) {
  std::ifstream in(path);
  if (!in) throw TraceError(path + ": cannot open the trace file");
  std::string text;
  size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); })) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      fail(path, line, std::string("not JSON (") + e.what() + ")");
    }
    if (!j.is_object()) fail(path, line, "expected one JSON object per line");
    TraceOp op;
    op.step = integer_field(j, "step", 0, path, line);
    op.microbatch = static_cast<int32_t>(integer_field(j, "microbatch", -1, path, line));
    op.pp_rank = static_cast<int32_t>(integer_field(j, "pp_rank", 0, path, line));
    op.dp_rank = static_cast<int32_t>(integer_field(j, "dp_rank", 0, path, line));
    op.tp_rank = static_cast<int32_t>(integer_field(j, "tp_rank", 0, path, line, 0));
    const auto name = j.find("op");
    if (name == j.end()) fail(path, line, "missing field \"op\"");
    if (!name->is_string() || name->get_ref<const std::string&>().empty())
      fail(path, line, "\"op\" must be a non-empty string, not " + name->dump());
    op.op = into.op_type(name->get_ref<const std::string&>());
    op.start_us = time_field(j, "start_us", path, line);
    op.end_us = time_field(j, "end_us", path, line);
    if (op.end_us < op.start_us) {
      fail(path, line, "end_us (" + std::to_string(op.end_us) + ") is before start_us (" +
                           std::to_string(op.start_us) + ")");
    }
    const auto group = j.find("group");
    if (group == j.end()) fail(path, line, "missing field \"group\" (null for a local op)");
    if (group->is_string()) {
      op.group = into.group_id(group->get_ref<const std::string&>());
    } else if (!group->is_null()) {
      fail(path, line, "\"group\" must be a string or null, not " + group->dump());
    }
    into.ops.push_back(op);
  }
  if (in.bad()) throw TraceError(path + ": read error after line " + std::to_string(line));
}

Trace read_traces(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  if (paths.empty()) throw TraceError("no trace given");
  Trace trace;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> files;
      for (const auto& entry : fs::directory_iterator(p))
        if (entry.is_regular_file() && entry.path().extension() == ".jsonl") files.push_back(entry.path().string());
      if (files.empty()) throw TraceError(p + ": a directory without .jsonl trace files");
      std::sort(files.begin(), files.end());
      for (const std::string& f : files) read_trace_file(f, trace);
    } else if (fs::exists(p, ec)) {
      read_trace_file(p, trace);
    } else {
      throw TraceError(p + ": no such trace file or directory");
    }
  }
  return trace;
}

void write_trace_line(std::ostream& out, int64_t step, int microbatch, int pp_rank, int dp_rank, int tp_rank,
                      std::string_view op, double start_us, double end_us, std::string_view group,
                      std::optional<int> rank) {
  JsonWriter json(out);
  json.begin_object();
  json.key("step").integer(step);
  json.key("microbatch").integer(microbatch);
  json.key("pp_rank").integer(pp_rank);
  json.key("dp_rank").integer(dp_rank);
  json.key("tp_rank").integer(tp_rank);
  json.key("op").string(op);
  json.key("start_us").fixed(start_us, 3);
  json.key("end_us").fixed(end_us, 3);
  json.key("group");
  if (group.empty()) {
    json.null();
  } else {
    json.string(group);
  }
  if (rank) json.key("rank").integer(*rank);
  json.end_object();
}

}  // namespace hdp
