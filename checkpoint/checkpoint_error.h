#pragma once
// The error of every checkpoint file this folder reads or writes (our checkpoints,
// safetensors files, Hugging Face model directories): bad input, exit code 2, its
// message naming the file and, where there is one, the tensor; and the one way
// those messages write a shape.

#include <cstdint>
#include <string>
#include <vector>

#include "base/errors.h"

namespace hdp {

class CheckpointError : public InputError {
 public:
  using InputError::InputError;
};

// "[4, 16]".
inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace hdp
