// Which ranks share a GPU (parallel/process_groups.h, describe_shared_gpus): what
// parallel.comm nccl refuses at start-up with exit 2, and auto falls back to MPI on.
// The gathering itself (gpus_shared_by_ranks) needs a GPU per rank to say anything.

#include <gtest/gtest.h>

#include "parallel/process_groups.h"

namespace hdp {
namespace {

TEST(SharedGpus, RanksWithAGpuOfTheirOwnShareNothing) {
  EXPECT_EQ(describe_shared_gpus({}), "");
  EXPECT_EQ(describe_shared_gpus({{0, "node1", "0000:18:00.0"}, {1, "node1", "0000:2A:00.0"},
                                  {2, "node2", "0000:18:00.0"}, {3, "node2", "0000:2A:00.0"}}),
            "");
}

TEST(SharedGpus, RanksOnOneGpuAreNamedWithTheGpuAndTheHost) {
  // Eight ranks on two nodes of two GPUs (ranks take local rank mod GPUs): ranks 0, 2
  // share node1's first GPU, and so on; listed in rank order whatever the input order.
  std::vector<RankGpu> gpus;
  for (int r = 7; r >= 0; --r) {
    gpus.push_back({r, r < 4 ? "node1" : "node2", r % 2 == 0 ? "0000:18:00.0" : "0000:2A:00.0"});
  }
  EXPECT_EQ(describe_shared_gpus(gpus),
            "ranks 0 and 2 share GPU 0000:18:00.0 on node1; ranks 1 and 3 share GPU 0000:2A:00.0 on node1; "
            "ranks 4 and 6 share GPU 0000:18:00.0 on node2; ranks 5 and 7 share GPU 0000:2A:00.0 on node2");
  EXPECT_EQ(describe_shared_gpus({{5, "h", "0000:18:00.0"}, {1, "h", "0000:18:00.0"}, {3, "h", "0000:18:00.0"},
                                  {2, "h", "0000:2A:00.0"}}),
            "ranks 1, 3 and 5 share GPU 0000:18:00.0 on h");
}

}  // namespace
}  // namespace hdp
