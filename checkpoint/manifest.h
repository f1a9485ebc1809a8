#pragma once
// A checkpoint's manifest.yaml (docs/checkpoint-format.md, "manifest.yaml"): the
// training's progress at the step, the layout that wrote the checkpoint, its parts
// and the run's config. Rank 0 writes it last, so a step directory under its final
// name that holds one is complete.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_error.h"
#include "data/batch.h"
#include "model/lr_schedule.h"
#include "spec/parallel_degrees.h"

namespace hdp {

struct TrainingProgress {
  int64_t step = 0;            // optimizer steps completed
  SamplerState sampler;        // where the next batch starts
  uint64_t train_seed = 0;
  uint64_t data_seed = 0;
  int64_t skipped_steps = 0;  // updates the numerical guard skipped so far (run/numerical_guard.h)
  // Rollbacks so far (run/training_loop.cpp), and where every global batch skipped by
  // one starts (a resumed run skips them too).
  int64_t rollbacks = 0;
  std::vector<SamplerState> skipped_batches;
  // Due checkpoints not written at their step so far, to keep their cost within
  // train.checkpoint_budget (run/training_loop.h).
  int64_t checkpoints_deferred = 0;
  // The numerical guard's windows of recent good losses and gradient norms, oldest
  // first, so that a resumed run judges spikes like one that never stopped.
  std::vector<double> loss_window;
  std::vector<double> grad_norm_window;
  // Whether the numerical guard vouched for the weights when they were saved: it
  // had passed a step after the run's first (which it cannot judge), so a blow-up
  // before the save would have been flagged. A checkpoint saved earlier is confirmed
  // once such a step passes (its manifest is rewritten then); rollbacks return only
  // to confirmed checkpoints (run/training_loop.h). Absent in older manifests: true.
  bool guard_confirmed = true;
  // The learning-rate schedule the run followed up to `step`, so that a resume can
  // refuse one that would jump (run/job.cpp). Absent in checkpoints written before
  // it was recorded, and in weights-only ones; the config in the manifest says it.
  std::optional<RunSchedule> lr_schedule;
};

// The version of the format this build writes, in the manifest and in every part,
// and the oldest it reads. 3: the checksum of four interleaved chains (2: one chain;
// docs/checkpoint-format.md, "Checksum"); nothing else differs.
inline constexpr int64_t kCheckpointFormatVersion = 3;
inline constexpr int64_t kOldestReadableCheckpointFormat = 2;
inline constexpr const char* kManifestFile = "manifest.yaml";

struct Manifest {
  int64_t format_version = 0;
  TrainingProgress progress;
  ParallelDegrees degrees;
  std::vector<std::string> parts;  // file names in the checkpoint directory, world rank order
  // The identity of the tokenizer of the data it was trained on (data/tokenizer_files.h),
  // whose copy is CHECKPOINT/tokenizer/ (checkpoint/tokenizer_copy.h); "" when none is
  // recorded (checkpoints written before, or data that keeps no copy).
  std::string tokenizer;
  std::string config;              // the run's YAML config, verbatim
  // Why a rollback to this checkpoint ran into bad steps again before getting past
  // them (run/training_loop.h): rollbacks and `resume: auto` pass it by. Empty: not
  // suspect. Set only by rewriting a committed manifest (mark_suspect).
  std::string suspect;
};

// CHECKPOINT/manifest.yaml. Throws CheckpointError naming the directory when it
// or its manifest is missing, and "<file>:<line>: <key>: <problem>" for a bad key.
Manifest read_manifest(const std::string& checkpoint);

// Writes CHECKPOINT/manifest.yaml through manifest.yaml.tmp and a rename, so that
// a checkpoint that had one keeps a whole one throughout. The config is a literal
// block when that keeps it exactly, else a double-quoted string; CheckpointError
// when neither does.
void write_manifest(const std::string& checkpoint, const Manifest& manifest);

// The config text stored in a checkpoint's manifest.
std::string checkpoint_config(const std::string& checkpoint);

}  // namespace hdp
