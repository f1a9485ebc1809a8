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
// written); deletes older complete ones and step-N.tmp directories of earlier
// steps. Failures to delete are not errors: the next save tries again.
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
// The newest complete checkpoint of a step before `step`, if any.
std::optional<std::string> latest_checkpoint_before(const std::string& checkpoint_dir, int64_t step);
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
