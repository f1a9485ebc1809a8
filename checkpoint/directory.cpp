#include "checkpoint/directory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
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

// The manifest of a listed complete checkpoint, or the reason it cannot be read
// (a damaged checkpoint: loading it would fail as well).
std::optional<Manifest> manifest_of(const Listed& l, std::string* error) {
  try {
    return read_manifest(l.path.string());
  } catch (const std::exception& e) {
    *error = e.what();
    return std::nullopt;
  }
}

// Nothing when a rollback may return to the checkpoint: the numerical guard
// confirmed it and no rollback to it ran into bad steps again. Else why not.
std::optional<std::string> why_no_rollback_target(const Listed& l) {
  std::string error;
  const std::optional<Manifest> m = manifest_of(l, &error);
  if (!m) return "its manifest cannot be read: " + error;
  if (!m->suspect.empty()) return "suspect: " + m->suspect;
  if (!m->progress.guard_confirmed) {
    return "unconfirmed: the numerical guard had passed no step after the run's first when it was saved, nor since";
  }
  return std::nullopt;
}

std::optional<Listed> newest_complete(const std::string& checkpoint_dir) {
  auto all = list_checkpoints(checkpoint_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->complete) return std::move(*it);
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
  bool rollback_target_kept = false;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete) {
      if (it->tmp && it->step < current_step) delete_listed(*it);
      continue;
    }
    const bool newest = it->step == current_step || kept < std::max<int64_t>(keep, 1);
    if (newest) ++kept;
    if (!rollback_target_kept && !why_no_rollback_target(*it)) {
      rollback_target_kept = true;
      continue;
    }
    if (!newest) delete_listed(*it);
  }
}

std::optional<std::string> latest_resumable_checkpoint(const std::string& checkpoint_dir,
                                                       std::vector<std::string>* passed_by) {
  auto all = list_checkpoints(checkpoint_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete) continue;
    std::string error;
    const std::optional<Manifest> m = manifest_of(*it, &error);
    // One that cannot be read is resumed from all the same: loading it says what is wrong.
    if (!m || m->suspect.empty()) return it->path.string();
    passed_by->push_back(it->path.string() + " (suspect: " + m->suspect + ")");
  }
  return std::nullopt;
}

std::optional<std::string> rollback_checkpoint_before(const std::string& checkpoint_dir, int64_t step,
                                                      const std::vector<int64_t>& excluded,
                                                      std::vector<std::string>* passed_by) {
  auto all = list_checkpoints(checkpoint_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->complete || it->step >= step) continue;
    const std::string path = it->path.string();
    if (std::find(excluded.begin(), excluded.end(), it->step) != excluded.end()) {
      passed_by->push_back(path + " (suspect: this run ran into bad steps again after rolling back to its step)");
    } else if (const std::optional<std::string> why_not = why_no_rollback_target(*it)) {
      passed_by->push_back(path + " (" + *why_not + ")");
    } else {
      return path;
    }
  }
  return std::nullopt;
}

int mark_suspect_from(const std::string& checkpoint_dir, int64_t step, const std::string& why) {
  int newer = 0;
  for (const Listed& l : list_checkpoints(checkpoint_dir)) {
    if (!l.complete || l.step < step) continue;
    Manifest m = read_manifest(l.path.string());
    m.suspect = l.step == step ? why
                               : "trained from the checkpoint of step " + std::to_string(step) + ", which is suspect";
    write_manifest(l.path.string(), m);
    if (l.step > step) ++newer;
  }
  return newer;
}

std::vector<std::string> confirm_checkpoints(const std::string& checkpoint_dir) {
  std::vector<std::string> confirmed;
  for (const Listed& l : list_checkpoints(checkpoint_dir)) {
    if (!l.complete) continue;
    std::string error;
    std::optional<Manifest> m = manifest_of(l, &error);
    if (!m || m->progress.guard_confirmed) continue;
    m->progress.guard_confirmed = true;
    write_manifest(l.path.string(), *m);
    confirmed.push_back(l.path.string());
  }
  return confirmed;
}

std::vector<std::string> manifestless_checkpoints(const std::string& checkpoint_dir) {
  std::vector<std::string> found;
  for (const Listed& l : list_checkpoints(checkpoint_dir)) {
    if (!l.complete && !l.tmp) found.push_back(l.path.string());
  }
  return found;
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir) {
  const std::optional<Listed> found = newest_complete(checkpoint_dir);
  if (!found) return std::nullopt;
  return found->path.string();
}

std::optional<int64_t> latest_checkpoint_step(const std::string& checkpoint_dir) {
  const std::optional<Listed> found = newest_complete(checkpoint_dir);
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
