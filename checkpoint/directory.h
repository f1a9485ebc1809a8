#pragma once
// A checkpoint directory (docs/checkpoint-format.md, "Writing and committing"):
// step-N/ per complete checkpoint (it holds manifest.yaml), step-N.tmp/ while one
// is written or after a crash, and whatever else someone put there. Finding the
// newest complete checkpoint, putting a new one in place, pruning old ones,
// deleting those of an abandoned trajectory and recording rollbacks; everything
// but what this trainer wrote is left alone.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"

namespace hdp {

// checkpoint_dir/step-00000123
std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step);

// Renames a checkpoint written into `tmp_dir` (its manifest in) to `final_path`,
// the checkpoint of `step`: one already there (a rerun of the step) is replaced,
// a step-N there without a manifest is moved aside (below). CheckpointError when
// that fails.
void rename_into_place(const std::string& tmp_dir, const std::string& final_path, int64_t step);

// Keeps the newest `keep` complete checkpoints (and that of `current_step`, just
// written), and the newest one the numerical guard confirmed when none of those is
// (a rollback returns only to a confirmed checkpoint, manifest.h); deletes older
// complete ones and step-N.tmp directories of earlier steps. Failures to delete
// are not errors: the next save tries again.
void prune_checkpoints(const std::string& checkpoint_dir, int64_t keep, int64_t current_step);

// The newest complete checkpoint in the directory, if any (directories without a
// committed manifest are ignored).
std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir);
// Its step (the N of its step-N name), if any.
std::optional<int64_t> latest_checkpoint_step(const std::string& checkpoint_dir);
// The step-N directories (final names, not step-N.tmp) without a manifest. This
// trainer never leaves one (it renames a checkpoint's directory to its final name
// only once the manifest is in), so they are someone's files: never resumed from,
// never deleted; rename_into_place moves one in the way of its step to
// step-N.incomplete (step-N.incomplete-2, ...) with a warning.
std::vector<std::string> manifestless_checkpoints(const std::string& checkpoint_dir);
// Where `resume: auto` resumes: the newest complete checkpoint not marked suspect
// (manifest.h). The suspect ones newer than it are added to `passed_by`, each as
// "PATH (suspect: WHY)", for the log.
std::optional<std::string> latest_resumable_checkpoint(const std::string& checkpoint_dir,
                                                       std::vector<std::string>* passed_by);
// Where a rollback returns: the newest complete checkpoint of a step before `step`
// that the numerical guard confirmed, is not marked suspect and whose step is not
// in `excluded`. The newer ones it passes by are added to `passed_by` with the
// reason, for the log.
std::optional<std::string> rollback_checkpoint_before(const std::string& checkpoint_dir, int64_t step,
                                                      const std::vector<int64_t>& excluded,
                                                      std::vector<std::string>* passed_by);
// Marks the complete checkpoint of `step` suspect, saying why, and every newer one,
// which was trained from it (their manifests rewritten atomically). Returns how
// many newer ones it marked.
int mark_suspect_from(const std::string& checkpoint_dir, int64_t step, const std::string& why);
// Marks every complete checkpoint the guard had not confirmed as confirmed; returns
// their paths.
std::vector<std::string> confirm_checkpoints(const std::string& checkpoint_dir);
// Deletes the checkpoints (complete or not) of steps after `step`: after a
// rollback they belong to an abandoned trajectory. Returns how many it deleted.
int delete_checkpoints_after(const std::string& checkpoint_dir, int64_t step);
// Rewrites the manifest of a committed checkpoint with these rollback records
// (atomically: the checkpoint stays complete throughout), so that a run resumed
// from it skips the batches too.
void record_rollbacks(const std::string& path, int64_t rollbacks, const std::vector<SamplerState>& skipped_batches);

// `path` itself when it is a checkpoint (holds manifest.yaml), else the newest complete
// checkpoint in it; CheckpointError when it is neither. What the converters and
// `trainer eval` take, so a user may name a step or a run's checkpoint directory.
std::string checkpoint_or_latest(const std::string& path);

}  // namespace hdp
