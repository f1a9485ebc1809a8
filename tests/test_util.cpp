#include "test_util.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <random>

namespace hdp::testing {

std::string scratch_dir(const std::string& name) {
  namespace fs = std::filesystem;
  // Under the build tree, so that suites of two build trees never share a directory.
  fs::path dir = fs::path(HDP_TEST_SCRATCH_DIR) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

CommandResult run_trainer(const std::string& args) {
#ifdef HDP_TRAINER_BINARY
  return run_command(std::string(HDP_TRAINER_BINARY) + " " + args);
#else
  return run_command("trainer " + args);
#endif
}

}  // namespace hdp::testing
