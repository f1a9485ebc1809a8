#pragma once
// The 3-D process grid: world = tp x pp x hdp. Tensor-parallel rank varies
// fastest, then hybrid-data-parallel, then pipeline stage:
//
//   rank = tp_rank + tp * (hdp_rank + hdp * pp_rank)
//
// so the tp peers of a layer are neighbouring ranks (one node), and a pipeline
// stage is a contiguous block of tp * hdp ranks. Groups are split once at start.

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

namespace hdp {

struct GridShape {
  int tp = 1;
  int pp = 1;
  int hdp = 1;
  int world() const { return tp * pp * hdp; }
};

struct GridCoords {
  int tp_rank = 0;
  int pp_rank = 0;
  int hdp_rank = 0;
};

GridCoords grid_coords(int rank, const GridShape& shape);
int grid_rank(const GridCoords& coords, const GridShape& shape);

// A table of every rank's coordinates, for the start-up log.
std::string describe_grid(const GridShape& shape);

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
  ProcessGroups(const GridShape& shape, bool tie_first_last, std::unique_ptr<MpiCommunicator> base = nullptr);
  ~ProcessGroups();

  const GridShape& shape() const { return shape_; }
  const GridCoords& coords() const { return coords_; }
  Communicator& world() const { return *world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& pp() const { return *pp_; }
  Communicator& hdp() const { return *hdp_; }
  // The first and last stage of this pipeline (same tp and hdp rank), or nullptr
  // when this rank is on neither or pp = 1.
  Communicator* tied() const { return tied_.get(); }

  bool first_stage() const { return coords_.pp_rank == 0; }
  bool last_stage() const { return coords_.pp_rank == shape_.pp - 1; }

 private:
  GridShape shape_;
  GridCoords coords_;
  std::unique_ptr<Communicator> world_, tp_, pp_, hdp_, tied_;
};

}  // namespace hdp
