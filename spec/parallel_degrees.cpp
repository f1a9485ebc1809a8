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
