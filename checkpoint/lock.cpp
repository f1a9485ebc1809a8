#include "checkpoint/lock.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "host H\npid P\n" -> H and P ("" and -1 when unreadable).
void parse_lock(const std::string& text, std::string& host, long& pid) {
  host.clear();
  pid = -1;
  std::istringstream in(text);
  for (std::string key; in >> key;) {
    if (key == "host") in >> host;
    else if (key == "pid") in >> pid;
  }
}

double age_seconds(const std::string& path) {
  std::error_code ec;
  const auto written = fs::last_write_time(path, ec);
  if (ec) return 0;
  return std::chrono::duration<double>(fs::file_time_type::clock::now() - written).count();
}

// What each locked directory is called and what two jobs in it would do, for messages.
struct LockedDirectoryText {
  const char* file_name;
  const char* key;
  const char* what;
  const char* harm;
};

LockedDirectoryText text_of(LockedDirectory what) {
  switch (what) {
    case LockedDirectory::Checkpoints:
      return {"trainer.lock", "train.checkpoint_dir", "checkpoint directory",
              "Two jobs writing one checkpoint directory overwrite each other's checkpoints"};
    case LockedDirectory::Run:
      return {kRunDirLockFile, "train.run_dir", "run directory",
              "Two jobs in one run directory lose each other's metrics (metrics.jsonl)"};
  }
  return {"", "", "", ""};
}

}  // namespace

DirectoryLock::DirectoryLock(LockedDirectory what, const std::string& directory, const std::string& hostname,
                             double stale_after_s)
    : content_("host " + hostname + "\npid " + std::to_string(::getpid()) + "\n") {
  const LockedDirectoryText t = text_of(what);
  path_ = (fs::path(directory) / t.file_name).string();
  std::error_code ec;
  fs::create_directories(directory, ec);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = ::open(path_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const bool written = ::write(fd, content_.data(), content_.size()) == static_cast<ssize_t>(content_.size());
      ::close(fd);
      if (!written) throw CheckpointError(path_ + ": cannot write the " + t.what + "'s lock file");
      return;
    }
    if (errno != EEXIST) {
      throw CheckpointError(path_ + ": cannot create the " + t.what + "'s lock file (" + std::strerror(errno) + ")");
    }
    std::string host;
    long pid = -1;
    parse_lock(read_all(path_), host, pid);
    const double age = age_seconds(path_);
    const bool dead_here = host == hostname && pid > 0 && (pid == ::getpid() || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH));
    const bool silent = stale_after_s > 0 && age > stale_after_s;
    if (!dead_here && !silent) {
      throw CheckpointError(std::string(t.key) + " '" + directory + "' is in use by another job: host " +
                            (host.empty() ? "?" : host) + ", pid " + (pid > 0 ? std::to_string(pid) : "?") +
                            " (lock file " + path_ + ", refreshed " + std::to_string(static_cast<long>(age)) +
                            " s ago). " + t.harm + ": stop that job or give this one another " + t.key +
                            " (delete the lock file only if that job is gone)");
    }
    spdlog::warn("{}: taking over the lock of host {} pid {} ({})", path_, host, pid,
                 dead_here ? "that process is gone" : "not refreshed for " + std::to_string(static_cast<long>(age)) + " s");
    fs::remove(path_, ec);
  }
  throw CheckpointError(path_ + ": could not take the " + std::string(t.what) +
                        "'s lock file (another job keeps taking it)");
}

DirectoryLock::~DirectoryLock() {
  if (read_all(path_) == content_) {
    std::error_code ec;
    fs::remove(path_, ec);
  }
}

void DirectoryLock::refresh() const { ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0); }

void check_checkpoint_dir_run(const Config& config) {
  if (config.train.reuse_checkpoint_dir) return;
  const std::string checkpoint_dir = resolved_checkpoint_dir(config.train);
  const auto latest = latest_checkpoint(checkpoint_dir);
  if (!latest) return;
  YAML::Node theirs, ours;
  try {
    theirs = YAML::Load(checkpoint_config(*latest));
    ours = YAML::Load(config.yaml);
  } catch (const std::exception& e) {
    spdlog::warn("{}: cannot read the config it was written with ({}); not checking that it is this run's", *latest,
                 e.what());
    return;
  }
  // What makes a run: its model and its data stream. Keys a checkpoint does not
  // have (written by an older build) are not compared.
  std::vector<std::string> differences;
  auto compare = [&](const std::string& section, const std::string& key, bool path) {
    const YAML::Node a = theirs[section][key], b = ours[section][key];
    if (!a || !b || !a.IsScalar() || !b.IsScalar()) {
      if (a && b && YAML::Dump(a) != YAML::Dump(b)) differences.push_back(section + "." + key + " " + YAML::Dump(a) + " there, " + YAML::Dump(b) + " here");
      return;
    }
    std::string x = a.Scalar(), y = b.Scalar();
    if (path) {
      std::error_code ec;
      x = fs::weakly_canonical(x, ec).string();
      y = fs::weakly_canonical(y, ec).string();
    }
    if (x != y) differences.push_back(section + "." + key + " " + a.Scalar() + " there, " + b.Scalar() + " here");
  };
  if (ours["model"] && ours["model"].IsMap()) {
    for (const auto& entry : ours["model"]) compare("model", entry.first.as<std::string>(), false);
  }
  compare("data", "path", true);
  compare("data", "seed", false);
  compare("train", "seed", false);
  if (differences.empty()) return;
  std::string list;
  for (const std::string& d : differences) list += (list.empty() ? "" : "; ") + d;
  throw CheckpointError("train.checkpoint_dir '" + checkpoint_dir +
                        "' holds the checkpoints of another run: the newest, " + *latest +
                        ", was written with another config (" + list +
                        "). Give this run its own train.checkpoint_dir, or set train.reuse_checkpoint_dir: true to "
                        "use this one anyway (train.resume: auto then continues that run's state under this config)");
}

}  // namespace hdp
