#pragma once
// Errors that mean "the input is wrong" (a config, a cost file, a cluster or
// model file, a dataset, a checkpoint, the command line): every command turns
// them into exit code 2 with their message, which names the file, line or key.

#include <stdexcept>

namespace hdp {

// A configuration file of any kind (training config, cost file, cluster and
// model files) or a --set override has a wrong, missing or impossible value.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace hdp
