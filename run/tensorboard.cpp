#include "run/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace hdp {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<tfevents::Scalar> tensorboard_scalars(const StepMetrics& m) {
  std::vector<tfevents::Scalar> out;
  auto add = [&](const std::string& tag, double value) { out.push_back({tag, static_cast<float>(value)}); };
  auto per_rank = [&](const std::string& key, const std::vector<double>& values) {
    for (size_t r = 0; r < values.size(); ++r) add(key + "/rank_" + std::to_string(r), values[r]);
  };
  add("loss", m.loss);
  add("lr", m.lr);
  add("grad_norm", m.grad_norm);
  add("tokens", m.tokens);
  add("input_tokens", m.input_tokens);
  add("rank_tokens", m.rank_tokens);
  add("micro_batches", m.micro_batches);
  add("tokens_per_s", m.tokens_per_s);
  add("step_ms", m.step_ms);
  add("data_wait_ms", m.data_wait_ms);
  add("mfu", m.mfu);
  add("peak_mem_bytes", m.peak_mem_bytes);
  add("tp_bytes", m.tp_bytes);
  add("pp_bytes", m.pp_bytes);
  add("hdp_bytes", m.hdp_bytes);
  add("ep_bytes", m.ep_bytes);
  add("attention_bytes", m.attention_bytes);
  add("busy_ms_min", m.busy_ms_min);
  add("busy_ms_max", m.busy_ms_max);
  add("idle_fraction", m.idle_fraction);
  add("planned_busy_ms_max", m.planned_busy_ms_max);
  add("cost_model_error", m.cost_model_error);
  add("planned_bound_ms", m.planned_bound_ms);
  per_rank("busy_ms", m.busy_ms);
  per_rank("planned_busy_ms", m.planned_busy_ms);
  add("activation_peak_bytes", m.activation_peak_bytes);
  add("host_pool_bytes", m.host_pool_bytes);
  add("offloaded_bytes", m.offloaded_bytes);
  add("skipped_steps", m.skipped_steps);
  if (m.moe) {
    add("aux_loss", m.aux_loss);
    for (size_t e = 0; e < m.expert_tokens.size(); ++e) {
      add("expert_tokens/expert_" + std::to_string(e), static_cast<double>(m.expert_tokens[e]));
    }
    add("expert_load_max_over_mean", m.expert_load_max_over_mean);
  }
  add("rollbacks", m.rollbacks);
  add("skipped_batches", m.skipped_batches);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& run_dir, const std::string& hostname,
                                     int64_t resumed_step) {
  const std::filesystem::path dir = std::filesystem::path(run_dir) / "tensorboard";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw MetricsError(dir.string() + ": cannot create the TensorBoard folder (" + ec.message() + ")");
  const double start = now_s();
  path_ = (dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(start)) + "." + hostname + "." +
                  std::to_string(::getpid())))
              .string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw MetricsError(path_ + ": cannot open the TensorBoard event file (" + std::strerror(errno) + ")");
  append(tfevents::file_version_event(start), "its file version");
  if (resumed_step > 0) restart_after(resumed_step);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write(const StepMetrics& m) {
  append(tfevents::scalars_event(m.time, m.step, tensorboard_scalars(m)), "the metrics of step " + std::to_string(m.step));
}

void TensorBoardWriter::restart_after(int64_t step) {
  append(tfevents::session_start_event(now_s(), step + 1), "a restart after step " + std::to_string(step));
}

void TensorBoardWriter::append(const std::string& event, const std::string& what) {
  const std::string record = tfevents::record(event);
  const ssize_t written = ::write(fd_, record.data(), record.size());
  if (written == static_cast<ssize_t>(record.size())) return;
  const std::string reason = written < 0 ? std::strerror(errno) : "only " + std::to_string(written) + " of " +
                                                                       std::to_string(record.size()) + " bytes written";
  throw MetricsError(path_ + ": cannot write " + what + " (" + reason + "); free space on its file system, or set "
                     "metrics.tensorboard: false");
}

}  // namespace hdp
