#include "run/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "base/json_writer.h"

namespace hdp {

// metrics.jsonl's line: "key": value pairs separated by ", ", numbers to 9
// significant digits (a float's precision), a diverged loss (NaN, infinity) as
// null, which JSON has instead (base/json_writer.h).
std::string to_json(const StepMetrics& m) {
  constexpr int kDigits = 9;
  std::ostringstream out;
  JsonWriter json(out, JsonWriter::Spacing::Spaced);
  struct Line {
    JsonWriter& json;
    void step(const char* key, int64_t v) { json.key(key).integer(v); }
    // To the millisecond: 9 significant digits would round Unix seconds to tens of seconds.
    void time(const char* key, double seconds) { json.key(key).fixed(seconds, 3); }
    void number(const char* key, double v) { json.key(key).number(v, kDigits); }
    void count(const char* key, int64_t v) { json.key(key).integer(v); }
    void per_rank(const char* key, const std::vector<double>& values) {
      json.key(key).begin_array();
      for (double v : values) json.number(v, kDigits);
      json.end_array();
    }
    void per_expert(const char* key, const std::vector<int64_t>& values) {
      json.key(key).begin_array();
      for (int64_t v : values) json.integer(v);
      json.end_array();
    }
  } line{json};
  json.begin_object();
  for_each_metric(m, line);
  json.end_object();
  return out.str();
}

MetricsWriter::MetricsWriter(const std::string& run_dir, int64_t resumed_step) {
  std::filesystem::create_directories(run_dir);
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  // Opened for appending and never replaced: a file renamed over it would leave a
  // writer that still has the old one open appending to a file no one sees.
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw MetricsError(path_ + ": cannot open the metrics file for writing (" + std::strerror(errno) + ")");
  // The lines to keep: the whole lines of steps up to the checkpoint resumed from,
  // from the top. The file is in step order (every run cuts it back to the step it
  // starts from before it appends), so what follows them are lines of steps after
  // it (run before a crash or a stop, now rerun) and a line cut short by a crash:
  // cut off in place, which a reader sees as the file ending earlier. The run
  // directory's lock (checkpoint/lock.h) keeps any other job from appending meanwhile.
  std::ifstream in(path_, std::ios::binary);
  int64_t kept = 0;
  for (std::string line; resumed_step > 0 && std::getline(in, line) && !in.eof();) {
    long long step = 0;
    if (std::sscanf(line.c_str(), "{\"step\": %lld", &step) != 1 || step > resumed_step || line.back() != '}') break;
    kept += static_cast<int64_t>(line.size()) + 1;
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || (st.st_size > kept && ::ftruncate(fd_, kept) != 0)) {
    const std::string reason = std::strerror(errno);
    ::close(fd_);
    throw MetricsError(path_ + ": cannot cut the metrics file back to step " + std::to_string(resumed_step) + " (" +
                       reason + ")");
  }
  size_ = kept;
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
