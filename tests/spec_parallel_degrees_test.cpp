// The process grid's rank order (spec/parallel_degrees.h): tp fastest, then
// hdp, then pp, and back.

#include <gtest/gtest.h>

#include "spec/parallel_degrees.h"

namespace hdp {
namespace {

TEST(ParallelDegrees, RankOrderIsTpFastestThenHdpThenPp) {
  const ParallelDegrees d{2, 2, 3};
  EXPECT_EQ(d.world(), 12);
  // rank 7 = 1 + 2 x (0 + 3 x 1)
  const GridCoords c = d.coords(7);
  EXPECT_EQ(c.tp_rank, 1);
  EXPECT_EQ(c.hdp_rank, 0);
  EXPECT_EQ(c.pp_rank, 1);
  EXPECT_EQ(d.rank({1, 1, 0}), 7);
  EXPECT_EQ(d.rank({0, 0, 2}), 4);
  for (int r = 0; r < d.world(); ++r) EXPECT_EQ(d.rank(d.coords(r)), r);
}

TEST(ParallelDegrees, DescribeGridListsEveryRank) {
  const std::string text = describe_grid(ParallelDegrees{2, 1, 2});
  EXPECT_EQ(text, "grid tp=2 pp=1 hdp=2 (rank: tp pp hdp)\n  0: 0 0 0 | 1: 1 0 0 | 2: 0 0 1 | 3: 1 0 1");
}

}  // namespace
}  // namespace hdp
