#pragma once
// The MPI process this rank runs in: start-up, node-local rank discovery, the
// per-rank thread budget, and taking the whole job down when one rank fails.

#include <cstdint>
#include <string>

namespace hdp {

struct ProcessInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;   // among the ranks on this node
  int local_size = 1;
  std::string hostname;
  bool thread_multiple = false;  // MPI may be called from several threads at once
};

// Initialises MPI (a binary started without mpirun is a single-rank job) and
// finalises it on destruction. One per process.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  const ProcessInfo& info() const { return info_; }
  // Ends every rank of the job with this exit code. Use after logging the reason.
  [[noreturn]] void abort(int exit_code) const;

 private:
  ProcessInfo info_;
};

// Ends every rank of the job with this exit code, from any thread. Use after
// logging the reason.
[[noreturn]] void abort_job(int exit_code);

// Cores this process may run on (its CPU affinity mask).
int available_cores();

// Sets the OpenMP thread count (the CPU kernels' only thread pool): `requested` when positive, otherwise the
// available cores divided by the ranks on this node (at least 1). Returns the count.
int configure_threads(int64_t requested, const ProcessInfo& process);

}  // namespace hdp
