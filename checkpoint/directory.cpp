#include "checkpoint/directory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <regex>

namespace hdp {
namespace {

namespace fs = std::filesystem;

struct Listed {
  int64_t step;
  fs::path path;
  bool complete;  // final name with a manifest
  bool tmp;       // step-N.tmp
};

std::vector<Listed> list_checkpoints(const std::string& dir) {
  static const std::regex pattern(R"(step-(\d+)(\.tmp)?)");
  std::vector<Listed> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern)) continue;
    std::error_code e2;
    if (!entry.is_directory(e2)) continue;
    Listed l{std::stoll(m[1]), entry.path(), false, m[2].matched};
    l.complete = !l.tmp && fs::is_regular_file(entry.path() / kManifestFile, e2);
    found.push_back(std::move(l));
  }
  std::sort(found.begin(), found.end(), [](const Listed& a, const Listed& b) { return a.step < b.step; });
  return found;
}

// `path`, or path-2, path-3, ...: the first that does not exist.
std::string unused_name(const std::string& path) {
  std::error_code ec;
  std::string name = path;
  for (int i = 2; fs::exists(name, ec); ++i) name = path + "-" + std::to_string(i);
  return name;
}

// Deletes a listed checkpoint. A complete one is renamed to step-N.tmp first, so
// that a crash half way leaves an unfinished directory (the next prune removes
// it), never a step-N without its manifest. False when it could not be deleted.
bool delete_listed(const Listed& l) {
  std::error_code ec;
  fs::path doomed = l.path;
  if (l.complete) {
    doomed += ".tmp";
    fs::remove_all(doomed, ec);
    fs::rename(l.path, doomed, ec);
    if (ec) {
      doomed = l.path;
      fs::remove(l.path / kManifestFile, ec);  // then at least never taken for complete
    }
  }
  fs::remove_all(doomed, ec);
  return !ec;
}

std::optional<Listed> newest_complete_before(const std::string& checkpoint_dir, int64_t step) {
  auto all = list_checkpoints(checkpoint_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete && it->step < step) return std::move(*it);
  }
  return std::nullopt;
}

}  // namespace

std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return (fs::path(checkpoint_dir) / name).string();
}

void rename_into_place(const std::string& tmp_dir, const std::string& final_path, int64_t step) {
  std::error_code ec;
  if (fs::exists(final_path, ec) && !fs::exists(fs::path(final_path) / kManifestFile, ec)) {
    // Not a checkpoint this trainer committed (those have a manifest): someone's
    // files, kept, not overwritten.
    const std::string aside = unused_name(final_path + ".incomplete");
    fs::rename(final_path, aside, ec);
    if (ec) throw CheckpointError(final_path + ": has no " + kManifestFile + " and cannot be moved aside: " + ec.message());
    spdlog::warn("{} had no {} (not a complete checkpoint): moved to {} to write the checkpoint of step {}",
                 final_path, kManifestFile, aside, step);
  }
  fs::remove_all(final_path, ec);  // a rerun of this step replaces it
  if (ec) throw CheckpointError(final_path + ": cannot replace: " + ec.message());
  fs::rename(tmp_dir, final_path, ec);
  if (ec) throw CheckpointError(final_path + ": renaming " + tmp_dir + " failed: " + ec.message());
}

void prune_checkpoints(const std::string& dir, int64_t keep, int64_t current_step) {
  auto all = list_checkpoints(dir);
  int64_t kept = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete) {
      if (it->step == current_step || kept < std::max<int64_t>(keep, 1)) {
        ++kept;
        continue;
      }
      delete_listed(*it);
    } else if (it->tmp && it->step < current_step) {
      delete_listed(*it);
    }
  }
}

std::optional<std::string> latest_checkpoint_before(const std::string& checkpoint_dir, int64_t step) {
  const std::optional<Listed> found = newest_complete_before(checkpoint_dir, step);
  if (!found) return std::nullopt;
  return found->path.string();
}

std::vector<std::string> manifestless_checkpoints(const std::string& checkpoint_dir) {
  std::vector<std::string> found;
  for (const Listed& l : list_checkpoints(checkpoint_dir)) {
    if (!l.complete && !l.tmp) found.push_back(l.path.string());
  }
  return found;
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir) {
  return latest_checkpoint_before(checkpoint_dir, std::numeric_limits<int64_t>::max());
}

std::optional<int64_t> latest_checkpoint_step(const std::string& checkpoint_dir) {
  const std::optional<Listed> found = newest_complete_before(checkpoint_dir, std::numeric_limits<int64_t>::max());
  if (!found) return std::nullopt;
  return found->step;
}

std::string checkpoint_or_latest(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifestFile, ec)) return path;
  if (auto latest = latest_checkpoint(path)) return *latest;
  throw CheckpointError(path + ": neither a checkpoint (no " + kManifestFile + ") nor a directory holding complete checkpoints");
}

int delete_checkpoints_after(const std::string& checkpoint_dir, int64_t step) {
  int deleted = 0;
  for (const Listed& l : list_checkpoints(checkpoint_dir)) {
    if (l.step <= step || (!l.complete && !l.tmp)) continue;  // a step-N without a manifest is not ours
    if (delete_listed(l)) ++deleted;
  }
  return deleted;
}

void record_rollbacks(const std::string& path, int64_t rollbacks, const std::vector<SamplerState>& skipped_batches) {
  Manifest m = read_manifest(path);
  m.progress.rollbacks = rollbacks;
  m.progress.skipped_batches = skipped_batches;
  write_manifest(path, m);
}

}  // namespace hdp
