#pragma once
// The degrees of the 3-D process grid, world = tp x pp x hdp, and where a rank
// sits in it. Tensor-parallel rank varies fastest, then hybrid-data-parallel, then
// pipeline stage:
//
//   rank = tp_rank + tp * (hdp_rank + hdp * pp_rank)
//
// so the tp peers of a layer are neighbouring ranks (one node), and a pipeline
// stage is a contiguous block of tp * hdp ranks. The trainer's process groups,
// its config and checkpoints, the op traces' merge and the simulated clusters of
// `trainer plan` all use this order.
//
// Expert parallelism (Mixtral) subdivides the hdp axis, as Megatron-core and
// DeepSpeed-MoE place expert groups inside the data-parallel group: ep consecutive
// hdp ranks form an expert-parallel group that shares the experts out (ep divides
// hdp), and the hdp ranks with the same place in their expert group form its
// expert-data-parallel group (hdp / ep ranks, which hold the same experts):
//
//   hdp_rank = ep_rank + ep * expert_dp_rank
//
// Every process group is one axis of this grid, as in picotron's process group
// manager (one grid, each group "vary one axis"): the ranks that differ from a
// rank along that axis only (ParallelDegrees::group).

#include <string>
#include <vector>

namespace hdp {

struct GridCoords {
  int tp_rank = 0;
  int pp_rank = 0;
  int hdp_rank = 0;
};

// The axes a process group varies along. Ep and ExpertDp are the two parts of Hdp.
enum class GridAxis { Tp, Pp, Hdp, Ep, ExpertDp };

struct ParallelDegrees {
  int tp = 1;
  int pp = 1;
  int hdp = 1;
  int ep = 1;  // expert-parallel degree inside hdp (1: every rank holds every expert)
  // Model chunks per pipeline stage (interleaved 1F1B, planning/pipeline_schedule.h):
  // no axis of the grid, each stage holds vpp of the pp x vpp virtual stages.
  int vpp = 1;

  int world() const { return tp * pp * hdp; }
  int ep_rank(const GridCoords& c) const { return c.hdp_rank % ep; }
  int expert_dp_rank(const GridCoords& c) const { return c.hdp_rank / ep; }
  GridCoords coords(int rank) const;
  int rank(const GridCoords& coords) const;

  // The number of ranks along `axis`, and where `c` sits on it.
  int size(GridAxis axis) const;
  int coordinate(const GridCoords& c, GridAxis axis) const;
  // The ranks that differ from `c` along `axis` only, in the order of their
  // coordinate on it: the members of c's group of that axis (c among them).
  std::vector<int> group(const GridCoords& c, GridAxis axis) const;
};

// A table of every rank's coordinates, for the start-up log.
std::string describe_grid(const ParallelDegrees& degrees);

}  // namespace hdp
