// The communicator conformance suite (communicator_conformance.h) under mpirun
// (ctest: 4 ranks) on the MPI communicator: host buffers as they are, host buffers
// through its staging path, the guarded test device's buffers (device memory the
// host may not touch, staged), CUDA buffers (pinned staging) and the NCCL
// communicator (split from an NCCL parent with ncclCommSplit). The last two skip,
// saying why, without a GPU or NCCL; with one GPU NCCL forms groups of one rank
// only (NCCL refuses two ranks on one GPU), while MPI on CUDA buffers uses them all.
// bench/gpu_parallel_check.sh runs it on a GPU machine.

#include "communicator_conformance.h"
#include "kernels/cuda/cuda_runtime.h"
#include "mpi_environment.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"

namespace hdp::testing {
namespace {

// The first `ranks` world ranks in a group of their own; nullptr on the others.
std::unique_ptr<MpiCommunicator> first_ranks(int ranks) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  return world.split(world.rank() < ranks ? 0 : -1, world.rank(), "conformance");
}

// Why no GPU can be used here ("" when one can); the first call binds this rank to
// GPU (world rank mod visible GPUs): the test runs on one node.
std::string gpu_unavailable() {
  static const std::string why = [] {
    std::string reason;
    if (!cuda::available(&reason)) return "no usable GPU (" + reason + ")";
    cuda::initialize(world_rank() % cuda::device_count());
    return std::string();
  }();
  return why;
}

struct MpiHostBackend {
  static std::string unavailable() { return {}; }
  static int max_ranks() { return world_size(); }
  static Device device() { return Device::CPU; }
  static constexpr bool kDetectsMismatchedCollectives = false;
  static void run(int ranks, const std::function<void(Communicator&)>& body) {
    if (auto comm = first_ranks(ranks)) body(*comm);
  }
};

struct MpiStagedHostBackend : MpiHostBackend {
  static void run(int ranks, const std::function<void(Communicator&)>& body) {
    if (auto comm = first_ranks(ranks)) {
      comm->stage_host_buffers_for_testing(true);
      body(*comm);
    }
  }
};

struct MpiGuardedBackend : MpiHostBackend {
  static Device device() { return Device::Guarded; }
};

struct MpiCudaBackend : MpiHostBackend {
  static std::string unavailable() { return gpu_unavailable(); }
  static Device device() { return Device::CUDA; }
};

struct NcclBackend {
  static std::string unavailable() {
    if (!nccl_compiled()) return "this build has no NCCL (it needs the CUDA backend and libnccl)";
    return gpu_unavailable();
  }
  // One GPU per rank: ranks r and r + GPUs would share one.
  static int max_ranks() { return std::min(world_size(), cuda::device_count()); }
  static Device device() { return Device::CUDA; }
  static constexpr bool kDetectsMismatchedCollectives = false;
  static void run(int ranks, const std::function<void(Communicator&)>& body) {
    // An NCCL parent over every rank with a GPU of its own, and the group split from it.
    std::unique_ptr<Communicator> parent;
    if (auto mpi = first_ranks(max_ranks())) parent = make_nccl_communicator(std::move(mpi));
    if (!parent) return;
    std::unique_ptr<Communicator> comm =
        split_nccl_communicator(*parent, parent->rank() < ranks ? 0 : -1, parent->rank(), "conformance");
    if (comm) body(*comm);
  }
};

}  // namespace

INSTANTIATE_TYPED_TEST_SUITE_P(MpiHost, CommunicatorConformance, MpiHostBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(MpiStagedHost, CommunicatorConformance, MpiStagedHostBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(MpiGuarded, CommunicatorConformance, MpiGuardedBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(MpiCuda, CommunicatorConformance, MpiCudaBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Nccl, CommunicatorConformance, NcclBackend);

}  // namespace hdp::testing
