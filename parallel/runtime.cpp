#include "parallel/runtime.h"

#include <mpi.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace hdp {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
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
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
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
