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
  // Every field of metrics.jsonl but the event's own (step, wall time); lists one
  // tag per rank or expert.
  struct Scalars {
    std::vector<tfevents::Scalar> out;
    void add(const std::string& tag, double value) { out.push_back({tag, static_cast<float>(value)}); }
    void step(const char*, int64_t) {}
    void time(const char*, double) {}
    void number(const char* key, double v) { add(key, v); }
    void count(const char* key, int64_t v) { add(key, static_cast<double>(v)); }
    void per_rank(const char* key, const std::vector<double>& values) {
      for (size_t r = 0; r < values.size(); ++r) add(std::string(key) + "/rank_" + std::to_string(r), values[r]);
    }
    void per_expert(const char* key, const std::vector<int64_t>& values) {
      for (size_t e = 0; e < values.size(); ++e)
        add(std::string(key) + "/expert_" + std::to_string(e), static_cast<double>(values[e]));
    }
  } scalars;
  for_each_metric(m, scalars);
  return std::move(scalars.out);
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
