#include "parallel/process_groups.h"

#include <mpi.h>

#include <stdexcept>

#include "parallel/mpi_communicator.h"

namespace hdp {

std::unique_ptr<MpiCommunicator> split_roles(int training_ranks) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  const bool trains = world.rank() < training_ranks;
  return world.split(trains ? 0 : 1, world.rank(), trains ? "training" : "loader");
}

ProcessGroups::ProcessGroups(const ParallelDegrees& degrees, bool tie_first_last,
                             std::unique_ptr<MpiCommunicator> base)
    : degrees_(degrees) {
  auto world = base ? std::move(base) : std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world");
  if (degrees.world() != world->size()) {
    throw std::invalid_argument("tp x pp x hdp = " + std::to_string(degrees.tp) + " x " + std::to_string(degrees.pp) +
                                " x " + std::to_string(degrees.hdp) + " = " + std::to_string(degrees.world()) +
                                " ranks, but the job has " + std::to_string(world->size()));
  }
  coords_ = degrees.coords(world->rank());
  const GridCoords& c = coords_;
  // color: the coordinates that the group members share; key: the varying one.
  tp_ = world->split(c.hdp_rank + degrees.hdp * c.pp_rank, c.tp_rank, "tp");
  hdp_ = world->split(c.tp_rank + degrees.tp * c.pp_rank, c.hdp_rank, "hdp");
  pp_ = world->split(c.tp_rank + degrees.tp * c.hdp_rank, c.pp_rank, "pp");
  const bool on_tied = tie_first_last && degrees.pp > 1 && (c.pp_rank == 0 || c.pp_rank == degrees.pp - 1);
  tied_ = world->split(on_tied ? c.tp_rank + degrees.tp * c.hdp_rank : -1, c.pp_rank, "tied-embeddings");
  world_ = std::move(world);
}

ProcessGroups::~ProcessGroups() = default;

}  // namespace hdp
