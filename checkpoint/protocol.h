#pragma once
// Saving and loading checkpoints under any parallel layout (docs/checkpoint-format.md):
// the protocol between the ranks.
//
// A checkpoint is a directory CHECKPOINT_DIR/step-00000123/ holding one HDF5 part
// per rank (checkpoint/format.h: rank-00005.h5, that rank's tensor-parallel slice
// of its stage's weights, written only by hdp rank 0 of each slice, and its ZeRO-1
// shard of the AdamW moments) and manifest.yaml (checkpoint/manifest.h), written
// last by rank 0 once every part is complete (step, sampler position, seeds,
// layout, config). The directory is written as step-00000123.tmp/ and renamed when
// the manifest is in, so a directory under its final name is complete
// (checkpoint/directory.h). Every tensor carries a checksum.
//
// A checkpoint written under one (tp, pp, hdp) loads under any other: a rank
// assembles the whole tensors it needs from the parts and takes its slice and
// its shard.

#include <cstdint>
#include <functional>
#include <string>

#include "checkpoint/format.h"
#include "checkpoint/manifest.h"
#include "data/tokenizer_files.h"
#include "model/model.h"
#include "parallel/zero_optimizer.h"

namespace hdp {

// Fills `out` from the model and optimizer (device to host copies).
void take_snapshot(const LlamaModel& model, const ZeroAdamW& optimizer, const TrainingProgress& progress,
                   const CheckpointLayout& layout, CheckpointSnapshot& out);

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

// The same from a snapshot. `tokenizer` (may be null): the copy of the data's
// tokenizer that rank 0 puts in the checkpoint (checkpoint/tokenizer_copy.h).
std::string save_checkpoint(const std::string& checkpoint_dir, const CheckpointSnapshot& snapshot,
                            const std::string& config_yaml, int64_t keep, const CheckpointLayout& layout,
                            const CheckpointHooks& hooks = {}, const TokenizerFiles* tokenizer = nullptr);

// A checkpoint of a whole model's weights only (one part, no optimizer state),
// committed like any other: what `train.init_from` takes (import-hf writes its
// step 0 this way). Deletes no other checkpoint of the directory. Resuming from
// it is refused (no moments); start from it with train.init_from.
std::string save_weights_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model,
                                    const TrainingProgress& progress, const std::string& config_yaml,
                                    const TokenizerFiles* tokenizer = nullptr);

// Loads this rank's slice of the weights (and, when optimizer is given, its shard of
// the moments) into a model whose global shapes must match, from a checkpoint
// written under any layout. Verifies checksums; throws CheckpointError naming the
// file and the tensor on any mismatch, truncation or corruption.
TrainingProgress load_checkpoint(const std::string& path, LlamaModel& model, ZeroAdamW* optimizer);

}  // namespace hdp
