// The process grid's rank order (spec/parallel_degrees.h): tp fastest, then
// hdp, then pp, and back; the groups along one axis.

#include <gtest/gtest.h>

#include <array>
#include <vector>

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

TEST(ParallelDegrees, AGroupIsTheRanksThatDifferAlongOneAxis) {
  // rank = tp + 2 (hdp + 3 pp); rank 7 is tp 1, hdp 0, pp 1.
  const ParallelDegrees d{2, 2, 3};
  const GridCoords c = d.coords(7);
  EXPECT_EQ(d.group(c, GridAxis::Tp), (std::vector<int>{6, 7}));
  EXPECT_EQ(d.group(c, GridAxis::Hdp), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(d.group(c, GridAxis::Pp), (std::vector<int>{1, 7}));
  EXPECT_EQ(d.group(c, GridAxis::Ep), (std::vector<int>{7}));  // ep = 1: a group of one
  EXPECT_EQ(d.group(c, GridAxis::ExpertDp), (std::vector<int>{7, 9, 11}));
  // Expert parallelism splits hdp 4 into expert groups of 2: hdp_rank = ep_rank + 2 expert_dp_rank.
  const ParallelDegrees e{1, 1, 4, 2};
  EXPECT_EQ(e.group(e.coords(3), GridAxis::Ep), (std::vector<int>{2, 3}));
  EXPECT_EQ(e.group(e.coords(3), GridAxis::ExpertDp), (std::vector<int>{1, 3}));
  EXPECT_EQ(e.coordinate(e.coords(3), GridAxis::Ep), 1);
  EXPECT_EQ(e.coordinate(e.coords(3), GridAxis::ExpertDp), 1);
}

TEST(ParallelDegrees, EachAxisPartitionsTheWorldIntoGroupsOrderedByTheirCoordinate) {
  const ParallelDegrees d{2, 3, 4, 2};
  for (GridAxis axis : {GridAxis::Tp, GridAxis::Pp, GridAxis::Hdp, GridAxis::Ep, GridAxis::ExpertDp}) {
    const bool in_hdp = axis == GridAxis::Hdp || axis == GridAxis::Ep || axis == GridAxis::ExpertDp;
    // What the members of a group share: every coordinate but the axis's own (-1),
    // the other part of hdp for ep and expert-dp.
    auto shared = [&](const GridCoords& g) {
      return std::array<int, 4>{axis == GridAxis::Tp ? -1 : g.tp_rank, axis == GridAxis::Pp ? -1 : g.pp_rank,
                                in_hdp ? -1 : g.hdp_rank,
                                axis == GridAxis::Ep         ? d.expert_dp_rank(g)
                                : axis == GridAxis::ExpertDp ? d.ep_rank(g)
                                                             : -1};
    };
    std::vector<int> groups_holding(d.world(), 0);
    for (int r = 0; r < d.world(); ++r) {
      const GridCoords c = d.coords(r);
      const std::vector<int> group = d.group(c, axis);
      ASSERT_EQ(static_cast<int>(group.size()), d.size(axis));
      EXPECT_EQ(group[d.coordinate(c, axis)], r);
      for (int k = 0; k < d.size(axis); ++k) {
        const GridCoords m = d.coords(group[k]);
        EXPECT_EQ(d.coordinate(m, axis), k);
        EXPECT_EQ(shared(m), shared(c)) << "rank " << r << " member " << group[k];
        if (group[0] == r) ++groups_holding[group[k]];  // each group counted once, by its first member
      }
    }
    for (int r = 0; r < d.world(); ++r) EXPECT_EQ(groups_holding[r], 1) << "rank " << r;
  }
}

TEST(ParallelDegrees, DescribeGridListsEveryRank) {
  const std::string text = describe_grid(ParallelDegrees{2, 1, 2});
  EXPECT_EQ(text, "grid tp=2 pp=1 hdp=2 (rank: tp pp hdp)\n  0: 0 0 0 | 1: 1 0 0 | 2: 0 0 1 | 3: 1 0 1");
}

}  // namespace
}  // namespace hdp
