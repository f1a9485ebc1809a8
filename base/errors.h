#pragma once
// Errors that mean "the input is wrong" (a config, a cost file, a cluster or
// model file, a dataset, a checkpoint, the command line): every command turns
// them into exit code 2 with their message, which names the file, line, key or
// argument (trainer/command_line.h). Any other exception is exit code 1.

#include <stdexcept>

namespace hdp {

// The base of every bad-input error.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration file of any kind (training config, cost file, cluster and
// model files) or a --set override has a wrong, missing or impossible value.
class ConfigError : public InputError {
 public:
  using InputError::InputError;
};

// A bad command line: reported with the command's usage hint, exit code 2.
class UsageError : public InputError {
 public:
  using InputError::InputError;
};

}  // namespace hdp
