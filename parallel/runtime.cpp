#include "parallel/runtime.h"

#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

namespace hdp {

namespace {

// srun started this process (a task of a job step, not the batch script, not a
// child of mpirun) with no PMIx or PMI2 server for MPI to start through.
bool srun_task_without_pmi() {
  auto set = [](const char* name) { return std::getenv(name) != nullptr; };
  if (!set("SLURM_STEP_ID") || !set("SLURM_PROCID")) return false;
  for (const char* name : {"PMIX_RANK", "PMIX_NAMESPACE", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_RANK"})
    if (set(name)) return false;
  return true;
}

// The message as every rank would say it: "on rank 3" names the rank saying it,
// so a message that differs from another rank's only there says the same.
std::string without_own_rank(std::string message, int rank) {
  const std::string own = "rank " + std::to_string(rank);
  for (size_t at = message.find(own); at != std::string::npos; at = message.find(own, at + 6)) {
    const size_t end = at + own.size();
    if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end])))
      message.replace(at, own.size(), "rank #");
  }
  return message;
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  if (srun_task_without_pmi()) {
    if (std::atoi(std::getenv("SLURM_PROCID")) == 0) {
      const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
      std::fprintf(stderr,
                   "error: srun started %s task(s) without a process-management interface (PMI) MPI can use, so "
                   "MPI_Init would fail; pass one: srun --mpi=pmix ... (Open MPI speaks PMIx; `srun --mpi=list` "
                   "shows what the cluster offers), or start the ranks with mpirun inside the allocation (sbatch "
                   "scripts/slurm/train.sbatch)\n",
                   tasks ? tasks : "the");
    }
    std::exit(2);
  }
  int provided = 0;
  // Threads other than the main one talk to MPI in some roles (the remote loader's
  // prefetch and scheduler threads), so ask for full thread support.
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  info_.thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(MPI_COMM_WORLD, &info_.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info_.world_size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info_.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &info_.local_rank);
  MPI_Comm_size(node, &info_.local_size);
  MPI_Comm_free(&node);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  info_.hostname.assign(name, len);
  MPI_Comm_dup(MPI_COMM_WORLD, &failures_);
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Comm_free(&failures_);
  MPI_Finalize();
}

FailureAgreement MpiRuntime::agree_on_failure(const std::string& message, double timeout_s) const {
  if (info_.world_size == 1) return {true, true};
  const uint64_t mine = std::hash<std::string>{}(without_own_rank(message, info_.rank));
  std::vector<uint64_t> all(static_cast<size_t>(info_.world_size));
  MPI_Request request;
  MPI_Iallgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, failures_, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int done = 0;
  while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Not everyone failed (or not in time): the request stays pending, the job is aborted next.
  if (!done) return {false, true};
  return {true, info_.rank == 0 || all[static_cast<size_t>(info_.rank)] != all[0]};
}

void MpiRuntime::end_failed(int exit_code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(exit_code);
}

void MpiRuntime::abort(int exit_code) const {
  if (info_.world_size > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
  MPI_Finalize();
  std::exit(exit_code);
}

void abort_job(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, omp_get_num_procs());
}

int configure_threads(int64_t requested, const ProcessInfo& process) {
  // A rank that mpirun bound to a subset of the cores already has its share;
  // otherwise the ranks on this node split the cores between them.
  const int cores = available_cores();
  const int online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const int share = cores < online ? cores : cores / std::max(1, process.local_size);
  const int threads = requested > 0 ? static_cast<int>(requested) : std::max(1, share);
  // OpenMP is the only thread pool: the CPU kernels split GEMMs over OpenMP
  // threads and keep OpenBLAS single-threaded (kernels/cpu/gemm.cpp).
  omp_set_num_threads(threads);
  return threads;
}

}  // namespace hdp
