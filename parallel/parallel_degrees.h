#pragma once
// The degrees of the 3-D process grid, world = tp x pp x hdp, and where a rank
// sits in it. Tensor-parallel rank varies fastest, then hybrid-data-parallel, then
// pipeline stage:
//
//   rank = tp_rank + tp * (hdp_rank + hdp * pp_rank)
//
// so the tp peers of a layer are neighbouring ranks (one node), and a pipeline
// stage is a contiguous block of tp * hdp ranks. The trainer's process groups,
// its config and checkpoints, and the simulated clusters of `trainer plan` all use
// this order.

#include <string>

namespace hdp {

struct GridCoords {
  int tp_rank = 0;
  int pp_rank = 0;
  int hdp_rank = 0;
};

struct ParallelDegrees {
  int tp = 1;
  int pp = 1;
  int hdp = 1;

  int world() const { return tp * pp * hdp; }
  GridCoords coords(int rank) const;
  int rank(const GridCoords& coords) const;
};

// A table of every rank's coordinates, for the start-up log.
std::string describe_grid(const ParallelDegrees& degrees);

}  // namespace hdp
