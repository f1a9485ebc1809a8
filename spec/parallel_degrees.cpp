#include "spec/parallel_degrees.h"

#include <cstdio>

namespace hdp {

GridCoords ParallelDegrees::coords(int rank) const {
  GridCoords c;
  c.tp_rank = rank % tp;
  c.hdp_rank = (rank / tp) % hdp;
  c.pp_rank = rank / (tp * hdp);
  return c;
}

int ParallelDegrees::rank(const GridCoords& c) const { return c.tp_rank + tp * (c.hdp_rank + hdp * c.pp_rank); }

int ParallelDegrees::size(GridAxis axis) const {
  switch (axis) {
    case GridAxis::Tp: return tp;
    case GridAxis::Pp: return pp;
    case GridAxis::Hdp: return hdp;
    case GridAxis::Ep: return ep;
    case GridAxis::ExpertDp: return hdp / ep;
  }
  return 1;
}

int ParallelDegrees::coordinate(const GridCoords& c, GridAxis axis) const {
  switch (axis) {
    case GridAxis::Tp: return c.tp_rank;
    case GridAxis::Pp: return c.pp_rank;
    case GridAxis::Hdp: return c.hdp_rank;
    case GridAxis::Ep: return ep_rank(c);
    case GridAxis::ExpertDp: return expert_dp_rank(c);
  }
  return 0;
}

std::vector<int> ParallelDegrees::group(const GridCoords& c, GridAxis axis) const {
  std::vector<int> ranks;
  for (int k = 0; k < size(axis); ++k) {
    GridCoords member = c;
    switch (axis) {
      case GridAxis::Tp: member.tp_rank = k; break;
      case GridAxis::Pp: member.pp_rank = k; break;
      case GridAxis::Hdp: member.hdp_rank = k; break;
      case GridAxis::Ep: member.hdp_rank = k + ep * expert_dp_rank(c); break;
      case GridAxis::ExpertDp: member.hdp_rank = ep_rank(c) + ep * k; break;
    }
    ranks.push_back(rank(member));
  }
  return ranks;
}

std::string describe_grid(const ParallelDegrees& d) {
  std::string out = "grid tp=" + std::to_string(d.tp) + " pp=" + std::to_string(d.pp) +
                    " hdp=" + std::to_string(d.hdp) +
                    (d.ep > 1 ? " ep=" + std::to_string(d.ep) + " (inside hdp)" : "") + " (rank: tp pp hdp)";
  for (int r = 0; r < d.world(); ++r) {
    const GridCoords c = d.coords(r);
    char line[64];
    std::snprintf(line, sizeof(line), "%s%d: %d %d %d", r % 8 == 0 ? "\n  " : " | ", r, c.tp_rank, c.pp_rank,
                  c.hdp_rank);
    out += line;
  }
  return out;
}

}  // namespace hdp
