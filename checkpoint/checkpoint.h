#pragma once
// Checkpoints under any parallel layout (docs/checkpoint-format.md).
//
// A checkpoint is a directory CHECKPOINT_DIR/step-00000123/ holding one HDF5 part
// per rank (rank-00005.h5: that rank's tensor-parallel slice of its stage's
// weights, written only by hdp rank 0 of each slice, and its ZeRO-1 shard of the
// AdamW moments) and manifest.yaml, written last by rank 0 once every part is
// complete (step, sampler position, seeds, layout, config). The directory is
// written as step-00000123.tmp/ and renamed when the manifest is in, so a
// directory under its final name is complete. Every tensor carries a checksum.
//
// A checkpoint written under one (tp, pp, hdp) loads under any other: a rank
// assembles the whole tensors it needs from the parts and takes its slice and
// its shard. `export_checkpoint` writes whole tensors under Hugging Face names
// into one HDF5 file for outside readers.

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/errors.h"
#include "data/batch.h"
#include "kernels/allocator.h"
#include "parallel/communicator.h"
#include "spec/parallel_degrees.h"
#include "parallel/zero_optimizer.h"
#include "model/model.h"

namespace hdp {

class CheckpointError : public InputError {
 public:
  using InputError::InputError;
};

struct TrainingProgress {
  int64_t step = 0;            // optimizer steps completed
  SamplerState sampler;        // where the next batch starts
  uint64_t train_seed = 0;
  uint64_t data_seed = 0;
  int64_t skipped_steps = 0;  // updates the numerical guard skipped so far (run/numerical_guard.h)
  // Rollbacks so far (run/training.cpp), and where every global batch skipped by
  // one starts (a resumed run skips them too).
  int64_t rollbacks = 0;
  std::vector<SamplerState> skipped_batches;
  // The numerical guard's window of recent good losses, oldest first, so that a
  // resumed run judges spikes like one that never stopped.
  std::vector<double> loss_window;
};

// Where this rank sits when it writes its part.
struct CheckpointLayout {
  ParallelDegrees degrees;
  GridCoords coords;
  int world_rank = 0;
  Communicator* world = nullptr;  // save synchronises over it (two all-reduces); nullptr = offline, see below
};

// What one rank's part holds, copied to host memory at a step boundary, so that
// the part can be written while training goes on (asynchronous checkpoints,
// checkpoint/checkpoint_writer.h): the parameters' layout and this rank's slice of
// their values (only when it writes weights: hdp rank 0), its ZeRO-1 segments and
// moment shards, and the progress. Its buffers are reused by the next snapshot, and
// are page-locked when the state is on a GPU (so the copies run at full bandwidth).
struct CheckpointSnapshot {
  std::vector<ParameterInfo> parameters;
  std::vector<ZeroAdamW::Segment> segments;
  HostBuffer flat_parameters;  // empty unless this rank writes weights
  HostBuffer exp_avg, exp_avg_sq;
  TrainingProgress progress;
};

// Fills `out` from the model and optimizer (device to host copies).
void take_snapshot(const LlamaModel& model, const ZeroAdamW& optimizer, const TrainingProgress& progress,
                   const CheckpointLayout& layout, CheckpointSnapshot& out);

// checkpoint_dir/step-00000123
std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step);

// Collective over layout.world: every rank writes its part, rank 0 commits the
// manifest, renames the directory and deletes all but the newest `keep` complete
// checkpoints. Returns the checkpoint's path. The optimizer's segments index
// model.parameters(). Every rank of the world must call it with the same step;
// no rank returns before the checkpoint is committed, and if any rank fails every
// rank throws CheckpointError and nothing is committed.
//
// Offline (layout.world == nullptr, e.g. tests or conversion tools writing every
// rank's part from one process): a rank other than 0 only writes its part into
// step-N.tmp/ and returns; rank 0 writes its part and commits, refusing if any
// part is missing. So call rank 0 last.
std::string save_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model, const ZeroAdamW& optimizer,
                            const TrainingProgress& progress, const std::string& config_yaml, int64_t keep,
                            const CheckpointLayout& layout);
// Test knobs of a save (HDP_FAULT_INJECT, base/fault_injection.h).
struct CheckpointHooks {
  // Runs before this rank creates the file of its part, with that file's path (a
  // symlink put there to /dev/full makes the part's writes fail with ENOSPC).
  std::function<void(const std::string& file)> before_part;
  // Runs once this rank's part is written and before the commit (a process killed
  // there leaves a half-written checkpoint).
  std::function<void()> after_part;
};

// The same from a snapshot.
std::string save_checkpoint(const std::string& checkpoint_dir, const CheckpointSnapshot& snapshot,
                            const std::string& config_yaml, int64_t keep, const CheckpointLayout& layout,
                            const CheckpointHooks& hooks = {});

// A checkpoint of a whole model's weights only (one part, no optimizer state),
// committed like any other: what `train.init_from` takes (import-hf writes its
// step 0 this way). Deletes no other checkpoint of the directory. Resuming from
// it is refused (no moments); start from it with train.init_from.
std::string save_weights_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model,
                                    const TrainingProgress& progress, const std::string& config_yaml);

// The newest complete checkpoint in the directory, if any (directories without a
// committed manifest are ignored).
std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir);
// Its step (the N of its step-N name), if any.
std::optional<int64_t> latest_checkpoint_step(const std::string& checkpoint_dir);
// The step-N directories (final names, not step-N.tmp) without a manifest. This
// trainer never leaves one (it renames a checkpoint's directory to its final name
// only once the manifest is in), so they are someone's files: never resumed from,
// never deleted; save_checkpoint moves one in the way of its step to
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

// Loads this rank's slice of the weights (and, when optimizer is given, its shard of
// the moments) into a model whose global shapes must match, from a checkpoint
// written under any layout. Verifies checksums; throws CheckpointError naming the
// file and the tensor on any mismatch, truncation or corruption.
TrainingProgress load_checkpoint(const std::string& path, LlamaModel& model, ZeroAdamW* optimizer);

// The config text stored in a checkpoint's manifest.
std::string checkpoint_config(const std::string& path);

// A checkpoint's weights as whole tensors, for converters (export, export-hf):
// their names and global shapes in the parts' order, then their values one
// tensor at a time (only one is in memory at once). `fn` runs with the HDF5
// lock held, so it must not read or write HDF5 files itself.
struct CheckpointTensorInfo {
  std::string name;             // Hugging Face name
  std::vector<int64_t> shape;   // the whole tensor's
};
struct CheckpointContents {
  TrainingProgress progress;
  std::string config;           // the config text of the manifest
  std::vector<CheckpointTensorInfo> tensors;
};
CheckpointContents checkpoint_contents(const std::string& path);
void read_whole_tensors(const std::string& path,
                        const std::function<void(const CheckpointTensorInfo&, std::vector<float>&&)>& fn);

// Writes every weight as a whole tensor under its Hugging Face name into one HDF5
// file (plus the config as an attribute), for outside readers.
void export_checkpoint(const std::string& path, const std::string& output);

}  // namespace hdp
