#pragma once
// The subcommands of the trainer executable. Each returns the process exit code
// of the table in trainer/command_line.h: 0 success, 2 bad input, 1 anything else.

#include <string>
#include <vector>

namespace hdp {

// argc/argv are handed to MPI; args are the arguments after the command name.
int command_train(int argc, char** argv, const std::vector<std::string>& args);
int command_prepare_data(const std::vector<std::string>& args);
int command_make_corpus(const std::vector<std::string>& args);
int command_export(const std::vector<std::string>& args);
int command_import_hf(const std::vector<std::string>& args);
int command_export_hf(const std::vector<std::string>& args);
int command_eval(const std::vector<std::string>& args);
int command_generate(const std::vector<std::string>& args);
int command_profile(const std::vector<std::string>& args);
int command_selftest(const std::vector<std::string>& args);
// trainer/config_command.cpp
int command_config(const std::vector<std::string>& args);
// trainer/plan_command.cpp
int command_plan(const std::vector<std::string>& args);
// trainer/analyze_command.cpp
int command_analyze(const std::vector<std::string>& args);
int command_trace(const std::vector<std::string>& args);
// trainer/plot_command.cpp
int command_plot(const std::vector<std::string>& args);
// trainer/supervise_command.cpp
int command_supervise(const std::vector<std::string>& args);

}  // namespace hdp
