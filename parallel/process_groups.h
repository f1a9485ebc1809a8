#pragma once
// The training ranks' communicators on the 3-D process grid of
// parallel/parallel_degrees.h (world = tp x pp x hdp): one group per axis, split
// once at start.

#include <memory>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/parallel_degrees.h"

namespace hdp {

// Collective over MPI_COMM_WORLD: the first `training_ranks` world ranks train, the
// others serve data. Returns this rank's role communicator (the training ranks'
// or the loader ranks').
std::unique_ptr<MpiCommunicator> split_roles(int training_ranks);

class ProcessGroups {
 public:
  // Splits the training ranks' communicator (all of MPI_COMM_WORLD unless `base` is
  // given: a job with loader ranks passes split_roles()'s result); `tie_first_last`
  // adds the group of the first and last stage of each pipeline (tied embeddings
  // under pipeline parallelism).
  ProcessGroups(const ParallelDegrees& degrees, bool tie_first_last, std::unique_ptr<MpiCommunicator> base = nullptr);
  ~ProcessGroups();

  const ParallelDegrees& degrees() const { return degrees_; }
  const GridCoords& coords() const { return coords_; }
  Communicator& world() const { return *world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& hdp() const { return *hdp_; }
  // The first and last stage of this pipeline (same tp and hdp rank), or nullptr
  // when this rank is on neither or pp = 1.
  Communicator* tied() const { return tied_.get(); }

  bool first_stage() const { return coords_.pp_rank == 0; }
  bool last_stage() const { return coords_.pp_rank == degrees_.pp - 1; }

 private:
  ParallelDegrees degrees_;
  GridCoords coords_;
  std::unique_ptr<Communicator> world_, tp_, pp_, hdp_, tied_;
};

}  // namespace hdp
