#include "whatif/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

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

// An integer field of at least `minimum` and at most `maximum` (ranks and
// micro-batches are 32-bit in the analysis: a larger value is refused, not cut).
int64_t integer_field(const nlohmann::json& j, const char* key, int64_t minimum, int64_t maximum,
                      const std::string& path, size_t line, std::optional<int64_t> fallback = std::nullopt) {
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
  if (v > maximum) {
    fail(path, line, std::string("\"") + key + "\" is " + std::to_string(v) + "; it must be at most " +
                         std::to_string(maximum));
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

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The largest rank of one field read so far, and the line that has it.
struct LargestRank {
  int64_t value = -1;
  std::string where;
  void see(int64_t v, const std::string& path, size_t line) {
    if (v <= value) return;
    value = v;
    where = path + ":" + std::to_string(line);
  }
};
// The grid the ranks span: the analysis and the merge size tables by it (one
// entry per pp x dp x tp worker), so it is checked against the operations the
// trace holds before anything is sized by it (read_traces).
struct RankExtent {
  LargestRank pp, dp, tp;
};

// Appends every operation of one JSONL file. Blank lines are skipped. Throws
// TraceError "<file>:<line>: <problem>" on a line that is not a JSON object, a
// missing or mistyped field, a negative rank or step, a rank or micro-batch above
// 2^31 - 1, or end_us < start_us.
void read_trace_file(const std::string& path, Trace& into, RankExtent& extent) {
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
    } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number beyond a double (1e400)
      fail(path, line, std::string("not JSON (") + e.what() + ")");
    }
    if (!j.is_object()) fail(path, line, "expected one JSON object per line");
    TraceOp op;
    op.step = integer_field(j, "step", 0, kInt64Max, path, line);
    op.microbatch = static_cast<int32_t>(integer_field(j, "microbatch", -1, kInt32Max, path, line));
    op.pp_rank = static_cast<int32_t>(integer_field(j, "pp_rank", 0, kInt32Max, path, line));
    op.dp_rank = static_cast<int32_t>(integer_field(j, "dp_rank", 0, kInt32Max, path, line));
    op.tp_rank = static_cast<int32_t>(integer_field(j, "tp_rank", 0, kInt32Max, path, line, 0));
    extent.pp.see(op.pp_rank, path, line);
    extent.dp.see(op.dp_rank, path, line);
    extent.tp.see(op.tp_rank, path, line);
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

// Every worker of a trace's grid records operations, so the grid has at most as
// many workers as the trace has operations; more means a rank far beyond the
// others (a corrupt or foreign line), which would size the tables by it. A grid of
// up to kWorkersAlwaysRead workers costs nothing to size and is read whatever the
// trace holds (a short or partial trace of a large job).
constexpr double kWorkersAlwaysRead = 65536;
void check_rank_extent(const Trace& trace, const RankExtent& extent) {
  const double workers = static_cast<double>(extent.pp.value + 1) * static_cast<double>(extent.dp.value + 1) *
                         static_cast<double>(extent.tp.value + 1);
  if (workers <= std::max(static_cast<double>(trace.ops.size()), kWorkersAlwaysRead)) return;
  const std::pair<const char*, const LargestRank*> fields[] = {
      {"pp_rank", &extent.pp}, {"dp_rank", &extent.dp}, {"tp_rank", &extent.tp}};
  const auto& [name, largest] = *std::max_element(std::begin(fields), std::end(fields), [](const auto& a, const auto& b) {
    return a.second->value < b.second->value;
  });
  char grid[64];
  std::snprintf(grid, sizeof(grid), "%.4g", workers);
  throw TraceError(largest->where + ": \"" + name + "\" is " + std::to_string(largest->value) +
                   ": the ranks of the trace (largest pp_rank " + std::to_string(extent.pp.value) + ", dp_rank " +
                   std::to_string(extent.dp.value) + ", tp_rank " + std::to_string(extent.tp.value) + ") span " + grid +
                   " workers, more than the " + std::to_string(trace.ops.size()) +
                   " operations it holds (every worker records some) and more than " +
                   std::to_string(static_cast<int64_t>(kWorkersAlwaysRead)) + ", which are read regardless");
}

}  // namespace

Trace read_traces(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  if (paths.empty()) throw TraceError("no trace given");
  Trace trace;
  RankExtent extent;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> files;
      for (const auto& entry : fs::directory_iterator(p))
        if (entry.is_regular_file() && entry.path().extension() == ".jsonl") files.push_back(entry.path().string());
      if (files.empty()) throw TraceError(p + ": a directory without .jsonl trace files");
      std::sort(files.begin(), files.end());
      for (const std::string& f : files) read_trace_file(f, trace, extent);
    } else if (fs::exists(p, ec)) {
      read_trace_file(p, trace, extent);
    } else {
      throw TraceError(p + ": no such trace file or directory");
    }
  }
  check_rank_extent(trace, extent);
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
