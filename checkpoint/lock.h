#pragma once
// One run per directory: the locks a job holds on its checkpoint and run
// directories, and the check that the checkpoints already there are this run's.
// Two jobs writing one checkpoint directory overwrite each other's checkpoints and
// a resume then continues whichever wrote last; two jobs in one run directory lose
// each other's metrics; a run started in a directory of another run's checkpoints
// silently continues that run under the new config. All are refused at start-up
// (exit code 2) with a message naming what is in the way.

#include <string>

#include "checkpoint/checkpoint_error.h"
#include "config/config.h"

namespace hdp {

// A lock file in a directory that one job at a time may use, held by world rank 0
// of that job: "host H\npid P\n", created exclusively (O_EXCL). A lock whose holder
// is a dead process on this host, or whose file was not refreshed for
// `stale_after_s` (another host's job that died; 0: never stale), is taken over
// with a warning. Removed when the job ends (also on errors); a job killed outright
// leaves it, and the next one takes it over as above. Each directory has a file
// name of its own, so that train.run_dir and train.checkpoint_dir may be one:
//   Checkpoints  CHECKPOINT_DIR/trainer.lock, while a job reads or writes its checkpoints
//   Run          RUN_DIR/run.lock, while a job appends to RUN_DIR/metrics.jsonl
enum class LockedDirectory { Checkpoints, Run };
// The run directory's lock file, also the job's heartbeat for `trainer supervise`.
inline constexpr const char* kRunDirLockFile = "run.lock";

class DirectoryLock {
 public:
  // Throws CheckpointError naming the directory's key and the holder's host and
  // pid when another live job holds it.
  DirectoryLock(LockedDirectory what, const std::string& directory, const std::string& hostname,
                double stale_after_s);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // Marks the lock as fresh (its modification time), once per step.
  void refresh() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string content_;  // what this job wrote: the lock is removed only while it still holds it
};

// Throws CheckpointError when train.checkpoint_dir's newest complete checkpoint was
// written by another run: its model, data.path, data.seed or train.seed differ from this config's. train.reuse_checkpoint_dir: true skips
// the check.
void check_checkpoint_dir_run(const Config& config);

}  // namespace hdp
