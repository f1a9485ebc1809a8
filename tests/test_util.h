#pragma once
// Small helpers shared by the tests: a scratch directory per test and running
// the trainer binary to check its exit code and messages.

#include <cstdint>
#include <exception>
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

// The message of the exception `f` throws, "" when it throws none.
template <class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Runs a shell command, capturing its output.
CommandResult run_command(const std::string& command);
// Runs the trainer binary with the given arguments.
CommandResult run_trainer(const std::string& args);

// Documents of the given lengths packed back to back into a batch with tokens,
// targets (the next token, -1 at a document's last), positions and cu_seqlens
// (a ReferenceBatch, a PackedMicroBatch, ...); the tokens below `vocab` come from
// a 64-bit LCG (Knuth's MMIX constants) started at `seed`.
template <class Batch>
Batch random_documents(const std::vector<int>& lengths, int vocab, uint64_t seed) {
  Batch b;
  b.cu_seqlens.push_back(0);
  for (int len : lengths) {
    const size_t start = b.tokens.size();
    for (int i = 0; i < len; ++i) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      b.tokens.push_back(static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(vocab)));
      b.positions.push_back(i);
    }
    for (int i = 0; i < len; ++i) b.targets.push_back(i + 1 < len ? b.tokens[start + i + 1] : -1);
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  return b;
}

}  // namespace hdp::testing
