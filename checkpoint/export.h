#pragma once
// A checkpoint's weights as whole tensors, whatever layout wrote it, for the
// converters: `trainer export` (one HDF5 file for outside readers,
// docs/checkpoint-format.md, "Export") and export-hf (checkpoint/hf_checkpoint.h).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"

namespace hdp {

// Their names and global shapes in the parts' order, then their values one
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
