#pragma once
// The training ranks' communicators on the 3-D process grid of
// spec/parallel_degrees.h (world = tp x pp x hdp): one group per axis (the ranks
// that differ from this one along that axis only, ParallelDegrees::group), split
// once at start, over MPI or NCCL (parallel.comm).

#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "spec/parallel_degrees.h"

namespace hdp {

// Collective over MPI_COMM_WORLD: the first `training_ranks` world ranks train, the
// others serve data. Returns this rank's role communicator (the training ranks'
// or the loader ranks').
std::unique_ptr<MpiCommunicator> split_roles(int training_ranks);

// What the tp, pp, hdp and tied groups move tensors with.
enum class CommBackend { Mpi, Nccl };

// Where a rank trains: its world rank, host name and GPU (PCI bus id: one GPU of a
// node whatever number CUDA_VISIBLE_DEVICES gives it).
struct RankGpu {
  int rank = 0;
  std::string host;
  std::string bus_id;
};
// The ranks that share a GPU with another, as "ranks 0 and 2 share GPU 0000:18:00.0
// on node1; ranks 1, 3 and 5 share ..."; empty when every rank has its own.
std::string describe_shared_gpus(const std::vector<RankGpu>& gpus);
// Collective over `world` (null: MPI_COMM_WORLD), each rank on its chosen GPU: the
// description above of the ranks of `world`. NCCL refuses two ranks of one
// communicator on one GPU, so this is asked before making any.
std::string gpus_shared_by_ranks(const MpiCommunicator* world, const std::string& hostname);

class ProcessGroups {
 public:
  // Splits the training ranks' communicator (all of MPI_COMM_WORLD unless `base` is
  // given: a job with loader ranks passes split_roles()'s result); `tie_first_last`
  // adds the group of the first and last stage of each pipeline (tied embeddings
  // under pipeline parallelism). With CommBackend::Nccl one NCCL communicator is made
  // over the training ranks and the groups are split from it (ncclCommSplit).
  ProcessGroups(const ParallelDegrees& degrees, bool tie_first_last, std::unique_ptr<MpiCommunicator> base = nullptr,
                CommBackend backend = CommBackend::Mpi);
  ~ProcessGroups();

  const ParallelDegrees& degrees() const { return degrees_; }
  const GridCoords& coords() const { return coords_; }
  // Always MPI: the world carries host values only (losses, norms, flags), and the
  // checkpoint writer and hang watchdog split their own communicators from it.
  Communicator& world() const { return *world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& hdp() const { return *hdp_; }
  // ZeRO-1's collectives (the gradient buckets' reduce-scatters, the parameters'
  // all-gathers): the hdp ranks again, as a communicator of their own. NCCL runs a
  // communicator's operations in order on one stream, so on hdp itself a ring
  // attention exchange queued behind a bucket's reduce-scatter (started during the
  // last micro-batch's backward) would wait for every hdp rank to reach that bucket,
  // while a rank whose last micro-batch is not that ring waits inside the ring for
  // it: a deadlock that MPI, which progresses each operation on its own, never shows.
  Communicator& gradients() const { return *gradients_; }
  // Expert parallelism (parallel_degrees.h): the ep hdp ranks that share the experts
  // out (nullptr when ep = 1), and the hdp / ep ranks that hold the same experts and
  // reduce their gradients, ZeRO-1's only (gradients() when ep = 1).
  Communicator* ep() const { return ep_.get(); }
  Communicator& expert_dp() const { return expert_dp_ ? *expert_dp_ : *gradients_; }
  // The first and last stage of this pipeline (same tp and hdp rank), or nullptr
  // when this rank is on neither or pp = 1.
  Communicator* tied() const { return tied_.get(); }
  CommBackend backend() const { return backend_; }

  bool first_stage() const { return coords_.pp_rank == 0; }
  bool last_stage() const { return coords_.pp_rank == degrees_.pp - 1; }

 private:
  ParallelDegrees degrees_;
  GridCoords coords_;
  CommBackend backend_;
  std::unique_ptr<Communicator> nccl_world_;  // the groups' parent under NCCL
  std::unique_ptr<Communicator> world_, tp_, pp_, hdp_, gradients_, tied_, ep_, expert_dp_;
};

}  // namespace hdp
