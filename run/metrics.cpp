#include "run/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace hdp {
namespace {

// JSON has no NaN or infinity; a diverged loss is written as null.
std::string number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", x);
  return buf;
}

}  // namespace

std::string numbers(const std::vector<double>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + number(values[i]);
  return s + "]";
}

std::string to_json(const StepMetrics& m) {
  std::string s = "{";
  s += "\"step\": " + std::to_string(m.step);
  s += ", \"loss\": " + number(m.loss);
  s += ", \"lr\": " + number(m.lr);
  s += ", \"grad_norm\": " + number(m.grad_norm);
  s += ", \"tokens\": " + std::to_string(m.tokens);
  s += ", \"input_tokens\": " + std::to_string(m.input_tokens);
  s += ", \"rank_tokens\": " + std::to_string(m.rank_tokens);
  s += ", \"micro_batches\": " + std::to_string(m.micro_batches);
  s += ", \"tokens_per_s\": " + number(m.tokens_per_s);
  s += ", \"step_ms\": " + number(m.step_ms);
  char time[32];
  std::snprintf(time, sizeof(time), "%.3f", m.time);  // milliseconds; %.9g would round to tens of seconds
  s += ", \"time\": " + std::string(time);
  s += ", \"data_wait_ms\": " + number(m.data_wait_ms);
  s += ", \"mfu\": " + number(m.mfu);
  s += ", \"peak_mem_bytes\": " + std::to_string(m.peak_mem_bytes);
  s += ", \"tp_bytes\": " + std::to_string(m.tp_bytes);
  s += ", \"pp_bytes\": " + std::to_string(m.pp_bytes);
  s += ", \"hdp_bytes\": " + std::to_string(m.hdp_bytes);
  s += ", \"ep_bytes\": " + std::to_string(m.ep_bytes);
  s += ", \"attention_bytes\": " + std::to_string(m.attention_bytes);
  s += ", \"busy_ms_min\": " + number(m.busy_ms_min);
  s += ", \"busy_ms_max\": " + number(m.busy_ms_max);
  s += ", \"idle_fraction\": " + number(m.idle_fraction);
  s += ", \"planned_busy_ms_max\": " + number(m.planned_busy_ms_max);
  s += ", \"cost_model_error\": " + number(m.cost_model_error);
  s += ", \"busy_ms\": " + numbers(m.busy_ms);
  s += ", \"planned_busy_ms\": " + numbers(m.planned_busy_ms);
  s += ", \"activation_peak_bytes\": " + std::to_string(m.activation_peak_bytes);
  s += ", \"host_pool_bytes\": " + std::to_string(m.host_pool_bytes);
  s += ", \"offloaded_bytes\": " + std::to_string(m.offloaded_bytes);
  s += ", \"skipped_steps\": " + std::to_string(m.skipped_steps);
  if (m.moe) {
    s += ", \"aux_loss\": " + number(m.aux_loss);
    std::string counts;
    for (size_t e = 0; e < m.expert_tokens.size(); ++e) counts += (e ? ", " : "") + std::to_string(m.expert_tokens[e]);
    s += ", \"expert_tokens\": [" + counts + "]";
    s += ", \"expert_load_max_over_mean\": " + number(m.expert_load_max_over_mean);
  }
  s += ", \"rollbacks\": " + std::to_string(m.rollbacks);
  s += ", \"skipped_batches\": " + std::to_string(m.skipped_batches);
  return s + "}";
}

MetricsWriter::MetricsWriter(const std::string& run_dir, int64_t resumed_step) {
  std::filesystem::create_directories(run_dir);
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  // The lines to keep: steps up to the checkpoint resumed from. Lines of later
  // steps (run before a crash or a stop, now rerun) and a line cut short by a
  // crash are dropped.
  std::string kept;
  if (resumed_step > 0) {
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      long long step = 0;
      if (std::sscanf(line.c_str(), "{\"step\": %lld", &step) == 1 && step <= resumed_step && line.back() == '}') {
        kept += line + '\n';
      }
    }
  }
  // Rewritten through a rename, so a crash now leaves the old file or the new one.
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    if (!out.flush()) {
      const std::string reason = std::strerror(errno);
      out.close();
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw MetricsError(tmp + ": cannot write the metrics file (" + reason + ")");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) throw MetricsError(path_ + ": renaming " + tmp + " failed: " + ec.message());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) throw MetricsError(path_ + ": cannot open the metrics file for writing (" + std::strerror(errno) + ")");
  size_ = static_cast<int64_t>(kept.size());
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const StepMetrics& m) {
  const std::string line = to_json(m) + '\n';
  const ssize_t written = ::write(fd_, line.data(), line.size());
  if (written == static_cast<ssize_t>(line.size())) {
    size_ += written;
    return;
  }
  // Nothing, or part of the line, reached the file: cut it back to its whole lines.
  const std::string reason = written < 0 ? std::strerror(errno) : "only " + std::to_string(written) + " of " +
                                                                       std::to_string(line.size()) + " bytes written";
  if (written > 0) (void)::ftruncate(fd_, size_);
  throw MetricsError(path_ + ": cannot write the metrics of step " + std::to_string(m.step) + " (" + reason +
                     "); free space on its file system (or raise the file size limit) and resume from the last "
                     "checkpoint");
}

void MetricsWriter::fail_writes_as_on_a_full_disk() {
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (full < 0) throw std::runtime_error(std::string("/dev/full: cannot open (") + std::strerror(errno) + ")");
  ::dup2(full, fd_);
  ::close(full);
}

}  // namespace hdp
