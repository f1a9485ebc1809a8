#pragma once
// The subcommands of the trainer executable. Each returns the process exit code:
// 0 success, 2 bad usage / config / input, 1 anything else.

#include <stdexcept>
#include <string>
#include <vector>

namespace hdp {

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

// A bad command line: reported with the command's usage hint, exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// argc/argv are handed to MPI; args are the arguments after the command name.
int command_train(int argc, char** argv, const std::vector<std::string>& args);
int command_prepare_data(const std::vector<std::string>& args);
int command_make_corpus(const std::vector<std::string>& args);
int command_export(const std::vector<std::string>& args);
int command_profile(const std::vector<std::string>& args);
int command_selftest(const std::vector<std::string>& args);
// trainer/plan_command.cpp
int command_plan(const std::vector<std::string>& args);

}  // namespace hdp
