#include "parallel/process_groups.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
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

std::string describe_shared_gpus(const std::vector<RankGpu>& gpus) {
  std::map<std::pair<std::string, std::string>, std::vector<int>> ranks_of;  // (host, bus id) -> world ranks
  for (const RankGpu& g : gpus) ranks_of[{g.host, g.bus_id}].push_back(g.rank);
  std::string shared;
  for (auto& [gpu, ranks] : ranks_of) {
    if (ranks.size() < 2) continue;
    std::sort(ranks.begin(), ranks.end());
    std::string list;
    for (size_t i = 0; i < ranks.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
    }
    shared += (shared.empty() ? "" : "; ") + std::string("ranks ") + list + " share GPU " + gpu.second + " on " + gpu.first;
  }
  return shared;
}

std::string gpus_shared_by_ranks(const MpiCommunicator* group, const std::string& hostname) {
  std::unique_ptr<MpiCommunicator> every_rank;
  if (group == nullptr) every_rank = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world");
  const MpiCommunicator& world = group ? *group : *every_rank;
  // Every rank's host name and bus id, fixed width, gathered everywhere.
  constexpr size_t kWidth = 128;
  std::vector<char> mine(2 * kWidth, '\0'), all(2 * kWidth * static_cast<size_t>(world.size()), '\0');
  const std::string bus_id = cuda::device_bus_id();
  std::memcpy(mine.data(), hostname.data(), std::min(hostname.size(), kWidth - 1));
  std::memcpy(mine.data() + kWidth, bus_id.data(), std::min(bus_id.size(), kWidth - 1));
  if (MPI_Allgather(mine.data(), 2 * kWidth, MPI_CHAR, all.data(), 2 * kWidth, MPI_CHAR, world.handle()) != MPI_SUCCESS) {
    throw std::runtime_error(world.name() + ": gathering the ranks' GPUs failed");
  }
  std::vector<RankGpu> gpus;
  for (int r = 0; r < world.size(); ++r) {
    const char* at = all.data() + 2 * kWidth * static_cast<size_t>(r);
    gpus.push_back({world.world_rank(r), std::string(at), std::string(at + kWidth)});
  }
  return describe_shared_gpus(gpus);
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
  // Each group is the ranks that differ from this one along one axis of the grid
  // (ParallelDegrees::group), ranked by their coordinate on it; its first member's
  // rank tells the groups of one split apart.
  auto group = [&](GridAxis axis, const char* name) {
    return split(degrees.group(c, axis).front(), degrees.coordinate(c, axis), name);
  };
  tp_ = group(GridAxis::Tp, "tp");
  hdp_ = group(GridAxis::Hdp, "hdp");
  gradients_ = group(GridAxis::Hdp, "hdp-gradients");
  pp_ = group(GridAxis::Pp, "pp");
  if (degrees.ep > 1) {
    if (degrees.hdp % degrees.ep != 0) {
      throw std::invalid_argument("ep = " + std::to_string(degrees.ep) + " does not divide hdp = " +
                                  std::to_string(degrees.hdp));
    }
    ep_ = group(GridAxis::Ep, "ep");
    expert_dp_ = group(GridAxis::ExpertDp, "expert-dp");
  }
  // Tied embeddings: the pp group's first and last stage only.
  const bool on_tied = tie_first_last && degrees.pp > 1 && (c.pp_rank == 0 || c.pp_rank == degrees.pp - 1);
  tied_ = split(on_tied ? degrees.group(c, GridAxis::Pp).front() : -1, c.pp_rank, "tied-embeddings");
  world_ = std::move(world);
}

ProcessGroups::~ProcessGroups() = default;

}  // namespace hdp
