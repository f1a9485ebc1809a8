#pragma once
// HDP_FAULT_INJECT=RANK:STEP[:hang|:nan], read by the training loop (trainer/training.cpp:
// that rank exits abruptly, without MPI_Finalize, when the step begins; with `:nan`
// instead the loss and gradients of its first micro-batch of that step become NaN,
// which the numerical guard must catch) and by the remote loader's servers
// (data/remote_loader.cpp: that rank exits abruptly, or with `:hang` stops
// answering, when asked for the tokens of that step). Tests use it to check that a
// job goes down promptly with a message, or survives a bad step.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hdp {

struct FaultInjection {
  int rank = -1;      // -1: no fault injected
  int64_t step = -1;
  bool hang = false;  // `:hang`: stop answering instead of exiting
  bool nan = false;   // `:nan`: a training rank poisons a micro-batch instead of exiting
};

// The fault HDP_FAULT_INJECT asks for; none when it is unset. Throws
// std::invalid_argument when it is set but not RANK:STEP[:hang|:nan].
inline FaultInjection fault_injection_from_env() {
  FaultInjection f;
  if (const char* spec = std::getenv("HDP_FAULT_INJECT")) {
    char mode[16] = "";
    long long step = -1;
    const int n = std::sscanf(spec, "%d:%lld:%15s", &f.rank, &step, mode);
    if (n < 2) throw std::invalid_argument(std::string("HDP_FAULT_INJECT='") + spec + "': expected RANK:STEP[:hang|:nan]");
    f.step = static_cast<int64_t>(step);
    f.hang = std::string(mode) == "hang";
    f.nan = std::string(mode) == "nan";
  }
  return f;
}

}  // namespace hdp
