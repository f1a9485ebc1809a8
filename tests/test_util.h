#pragma once
// Small helpers shared by the tests: a scratch directory per test and running
// the trainer binary to check its exit code and messages.

#include <cstdint>
#include <string>
#include <vector>

namespace hdp::testing {

// A fresh empty directory under the build tree, removed and recreated on each call.
std::string scratch_dir(const std::string& name);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// n floats uniform in [lo, hi) from std::mt19937(seed).
std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// Runs a shell command, capturing its output.
CommandResult run_command(const std::string& command);
// Runs the trainer binary with the given arguments.
CommandResult run_trainer(const std::string& args);

}  // namespace hdp::testing
