#pragma once
// Checkpoints: one HDF5 file per saved step (docs/checkpoint-format.md).
// Parameters are stored whole under their Hugging Face names ([out, in], float32)
// so any HDF5 reader can use them; beside them the AdamW moments, the step, the
// sampler position and the config. Every dataset carries a checksum; a file is
// written under a temporary name and renamed only when complete.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/batch.h"
#include "trainer/model.h"
#include "trainer/optimizer.h"

namespace hdp {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainingProgress {
  int64_t step = 0;            // optimizer steps completed
  SamplerState sampler;        // where the next batch starts
  uint64_t train_seed = 0;
  uint64_t data_seed = 0;
};

// checkpoint_dir/step-000123.h5
std::string checkpoint_path(const std::string& checkpoint_dir, int64_t step);

// Writes a checkpoint and deletes all but the newest `keep` complete ones. Returns its path.
std::string save_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model, const AdamW& optimizer,
                            const TrainingProgress& progress, const std::string& config_yaml, int64_t keep);

// The newest complete checkpoint in the directory, if any (temporary files are ignored).
std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir);

// Loads weights (and, when optimizer is given, the moments) into an existing model
// whose shapes must match. Verifies every checksum first; throws CheckpointError
// naming the file and the tensor on any mismatch, truncation or corruption.
TrainingProgress load_checkpoint(const std::string& path, LlamaModel& model, AdamW* optimizer);

// The config text stored in a checkpoint.
std::string checkpoint_config(const std::string& path);

}  // namespace hdp
