#pragma once
// Small helpers shared by the tests: a scratch directory per test and running
// the trainer binary to check its exit code and messages.

#include <string>

namespace hdp::testing {

// A fresh empty directory under the build tree, removed and recreated on each call.
std::string scratch_dir(const std::string& name);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs a shell command, capturing its output.
CommandResult run_command(const std::string& command);
// Runs the trainer binary with the given arguments.
CommandResult run_trainer(const std::string& args);

}  // namespace hdp::testing
