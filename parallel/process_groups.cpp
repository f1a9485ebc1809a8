#include "parallel/process_groups.h"

#include <mpi.h>

#include <cstdio>
#include <stdexcept>

#include "parallel/mpi_communicator.h"

namespace hdp {

GridCoords grid_coords(int rank, const GridShape& s) {
  GridCoords c;
  c.tp_rank = rank % s.tp;
  c.hdp_rank = (rank / s.tp) % s.hdp;
  c.pp_rank = rank / (s.tp * s.hdp);
  return c;
}

int grid_rank(const GridCoords& c, const GridShape& s) { return c.tp_rank + s.tp * (c.hdp_rank + s.hdp * c.pp_rank); }

std::string describe_grid(const GridShape& s) {
  std::string out = "grid tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp) +
                    " hdp=" + std::to_string(s.hdp) + " (rank: tp pp hdp)";
  for (int r = 0; r < s.world(); ++r) {
    const GridCoords c = grid_coords(r, s);
    char line[64];
    std::snprintf(line, sizeof(line), "%s%d: %d %d %d", r % 8 == 0 ? "\n  " : " | ", r, c.tp_rank, c.pp_rank,
                  c.hdp_rank);
    out += line;
  }
  return out;
}

std::unique_ptr<MpiCommunicator> split_roles(int training_ranks) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  const bool trains = world.rank() < training_ranks;
  return world.split(trains ? 0 : 1, world.rank(), trains ? "training" : "loader");
}

ProcessGroups::ProcessGroups(const GridShape& shape, bool tie_first_last, std::unique_ptr<MpiCommunicator> base)
    : shape_(shape) {
  auto world = base ? std::move(base) : std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world");
  if (shape.world() != world->size()) {
    throw std::invalid_argument("tp x pp x hdp = " + std::to_string(shape.tp) + " x " + std::to_string(shape.pp) +
                                " x " + std::to_string(shape.hdp) + " = " + std::to_string(shape.world()) +
                                " ranks, but the job has " + std::to_string(world->size()));
  }
  coords_ = grid_coords(world->rank(), shape);
  const GridCoords& c = coords_;
  // color: the coordinates that the group members share; key: the varying one.
  tp_ = world->split(c.hdp_rank + shape.hdp * c.pp_rank, c.tp_rank, "tp");
  hdp_ = world->split(c.tp_rank + shape.tp * c.pp_rank, c.hdp_rank, "hdp");
  pp_ = world->split(c.tp_rank + shape.tp * c.hdp_rank, c.pp_rank, "pp");
  const bool on_tied = tie_first_last && shape.pp > 1 && (c.pp_rank == 0 || c.pp_rank == shape.pp - 1);
  tied_ = world->split(on_tied ? c.tp_rank + shape.tp * c.hdp_rank : -1, c.pp_rank, "tied-embeddings");
  world_ = std::move(world);
}

ProcessGroups::~ProcessGroups() = default;

}  // namespace hdp
