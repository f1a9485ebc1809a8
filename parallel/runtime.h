#pragma once
// The MPI process this rank runs in: start-up, node-local rank discovery, the
// per-rank thread budget, and taking the whole job down when one rank fails.

#include <mpi.h>

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

// What a failed rank does about its error (MpiRuntime::agree_on_failure).
struct FailureAgreement {
  bool every_rank_failed = false;  // then each rank ends by itself, no abort needed
  bool print = true;               // this rank says its error
};

// Initialises MPI (a binary started without mpirun is a single-rank job) and
// finalises it on destruction. One per process. A process that srun started
// without a process-management interface MPI can use (plain srun under
// MpiDefault=none) is told to pass --mpi=pmix and exits with code 2 before
// MPI_Init, which would fail inside the library with a message about its build.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  const ProcessInfo& info() const { return info_; }
  // Ends every rank of the job with this exit code. Use after logging the reason.
  [[noreturn]] void abort(int exit_code) const;

  // One error line per job: called by a rank whose command failed, with its
  // message. Waits up to timeout_s for every rank to fail too (a collective on a
  // communicator of its own that only failing ranks join). When they all did (bad
  // input every rank read alike), rank 0 prints and the others only when their
  // message differs from rank 0's; otherwise this rank may be the only one that
  // knows, and prints (then abort the job). Messages are compared with this
  // rank's own number ("on rank 3") left out.
  FailureAgreement agree_on_failure(const std::string& message, double timeout_s) const;
  // Ends this rank with exit_code once every rank has failed: no MPI_Finalize and
  // no clean-up, which a background thread still inside MPI or HDF5 could block.
  [[noreturn]] void end_failed(int exit_code) const;

 private:
  ProcessInfo info_;
  MPI_Comm failures_ = MPI_COMM_NULL;  // agree_on_failure's own communicator
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
