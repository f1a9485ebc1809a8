#include "parallel/process_groups.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/cuda_runtime.h"
#include "parallel/mpi_communicator.h"
#include "parallel/nccl_communicator.h"

namespace hdp {

std::unique_ptr<MpiCommunicator> split_roles(int training_ranks) {
  MpiCommunicator world(MPI_COMM_WORLD, "world");
  const bool trains = world.rank() < training_ranks;
  return world.split(trains ? 0 : 1, world.rank(), trains ? "training" : "loader");
}

std::string gpus_shared_by_ranks(const MpiCommunicator* group, const std::string& hostname) {
  std::unique_ptr<MpiCommunicator> every_rank;
  if (group == nullptr) every_rank = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world");
  const MpiCommunicator& world = group ? *group : *every_rank;
  // Every rank's "host GPU-bus-id", fixed width, gathered everywhere.
  constexpr int kWidth = 256;
  std::vector<char> mine(kWidth, '\0'), all(static_cast<size_t>(kWidth) * static_cast<size_t>(world.size()), '\0');
  const std::string id = hostname + " " + cuda::device_bus_id();
  std::memcpy(mine.data(), id.data(), std::min<size_t>(id.size(), kWidth - 1));
  if (MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, world.handle()) != MPI_SUCCESS) {
    throw std::runtime_error(world.name() + ": gathering the ranks' GPUs failed");
  }
  std::map<std::string, std::vector<int>> ranks_of;  // "host bus-id" -> ranks, in rank order
  for (int r = 0; r < world.size(); ++r) ranks_of[std::string(all.data() + static_cast<size_t>(r) * kWidth)].push_back(r);
  std::string shared;
  for (const auto& [gpu, ranks] : ranks_of) {
    if (ranks.size() < 2) continue;
    std::string list;
    for (size_t i = 0; i < ranks.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(world.world_rank(ranks[i]));
    }
    const size_t space = gpu.find(' ');
    shared += (shared.empty() ? "" : "; ") + std::string("ranks ") + list + " share GPU " + gpu.substr(space + 1) +
              " on " + gpu.substr(0, space);
  }
  return shared;
}

ProcessGroups::ProcessGroups(const ParallelDegrees& degrees, bool tie_first_last,
                             std::unique_ptr<MpiCommunicator> base, CommBackend backend)
    : degrees_(degrees), backend_(backend) {
  auto world = base ? std::move(base) : std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world");
  if (degrees.world() != world->size()) {
    throw std::invalid_argument("tp x pp x hdp = " + std::to_string(degrees.tp) + " x " + std::to_string(degrees.pp) +
                                " x " + std::to_string(degrees.hdp) + " = " + std::to_string(degrees.world()) +
                                " ranks, but the job has " + std::to_string(world->size()));
  }
  coords_ = degrees.coords(world->rank());
  const GridCoords& c = coords_;
  // The groups' parent: the MPI world itself, or one NCCL communicator over it.
  if (backend == CommBackend::Nccl) nccl_world_ = make_nccl_communicator(world->split(0, world->rank(), "world"));
  auto split = [&](int color, int key, const char* name) -> std::unique_ptr<Communicator> {
    if (nccl_world_) return split_nccl_communicator(*nccl_world_, color, key, name);
    return world->split(color, key, name);
  };
  // color: the coordinates that the group members share; key: the varying one.
  tp_ = split(c.hdp_rank + degrees.hdp * c.pp_rank, c.tp_rank, "tp");
  hdp_ = split(c.tp_rank + degrees.tp * c.pp_rank, c.hdp_rank, "hdp");
  pp_ = split(c.tp_rank + degrees.tp * c.hdp_rank, c.pp_rank, "pp");
  const bool on_tied = tie_first_last && degrees.pp > 1 && (c.pp_rank == 0 || c.pp_rank == degrees.pp - 1);
  tied_ = split(on_tied ? c.tp_rank + degrees.tp * c.hdp_rank : -1, c.pp_rank, "tied-embeddings");
  world_ = std::move(world);
}

ProcessGroups::~ProcessGroups() = default;

}  // namespace hdp
