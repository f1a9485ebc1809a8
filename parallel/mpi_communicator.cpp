#include "parallel/mpi_communicator.h"

#include <climits>
#include <functional>
#include <vector>
#include <stdexcept>

#include "kernels/device.h"

namespace hdp {
namespace {

class MpiPending final : public CommRequest::Pending {
 public:
  MPI_Request request = MPI_REQUEST_NULL;
  // Count and displacement arrays of a v-collective must outlive the call.
  std::vector<int> counts, displacements;
  void wait() override { MPI_Wait(&request, MPI_STATUS_IGNORE); }
};

CommRequest start(const std::function<void(MpiPending&)>& call) {
  auto pending = std::make_unique<MpiPending>();
  call(*pending);
  return CommRequest(std::move(pending));
}

// Part sizes and offsets of an even split of n elements (Communicator::part_begin).
void split_counts(int64_t n, int parts, MpiPending& p) {
  p.counts.resize(parts);
  p.displacements.resize(parts);
  for (int r = 0; r < parts; ++r) {
    p.displacements[r] = static_cast<int>(part_begin(n, r, parts));
    p.counts[r] = static_cast<int>(part_begin(n, r + 1, parts) - part_begin(n, r, parts));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

// A group of one moves no data, so its "collectives" accept device buffers; larger
// groups need host memory until a device-aware communicator (NCCL) exists.
int count_of(const Tensor& t, const std::string& what, int group_size) {
  if (t.device != Device::CPU && group_size > 1) {
    throw std::invalid_argument("MPI " + what + ": the MPI communicator moves host memory only, and this buffer is on " +
                                device_name(t.device));
  }
  if (t.numel() > INT_MAX) throw std::invalid_argument("MPI " + what + ": more than 2^31 elements in one call");
  return static_cast<int>(t.numel());
}

int64_t ring_bytes(int64_t bytes, int n, int passes) { return n <= 1 ? 0 : passes * bytes * (n - 1) / n; }

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key, std::string name) const {
  MPI_Comm out = MPI_COMM_NULL;
  MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out);
  if (out == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(out, std::move(name));
}

CommRequest MpiCommunicator::all_reduce_async(Tensor data, ReduceOp op) {
  const int n = count_of(data, name_ + " all-reduce", size_);
  stats_.collective_bytes += ring_bytes(static_cast<int64_t>(data.bytes()), size_, 2);
  ++stats_.collectives;
  if (size_ == 1) return {};
  return start([&](MpiPending& p) {
    MPI_Iallreduce(MPI_IN_PLACE, data.data, n, MPI_FLOAT, mpi_op(op), comm_, &p.request);
  });
}

CommRequest MpiCommunicator::reduce_scatter_async(const Tensor& send, Tensor recv) {
  const int n = count_of(send, name_ + " reduce-scatter", size_);
  count_of(recv, name_ + " reduce-scatter", size_);
  const int64_t mine = part_begin(n, rank_ + 1, size_) - part_begin(n, rank_, size_);
  if (recv.numel() != mine) {
    throw std::invalid_argument(name_ + " reduce-scatter: rank " + std::to_string(rank_) + " receives " +
                                std::to_string(recv.numel()) + " elements, its part of " + std::to_string(n) +
                                " has " + std::to_string(mine));
  }
  stats_.collective_bytes += ring_bytes(static_cast<int64_t>(send.bytes()), size_, 1);
  ++stats_.collectives;
  return start([&](MpiPending& p) {
    split_counts(n, size_, p);
    MPI_Ireduce_scatter(send.data, recv.data, p.counts.data(), MPI_FLOAT, MPI_SUM, comm_, &p.request);
  });
}

CommRequest MpiCommunicator::all_gather_async(Tensor buffer) {
  const int n = count_of(buffer, name_ + " all-gather", size_);
  stats_.collective_bytes += ring_bytes(static_cast<int64_t>(buffer.bytes()), size_, 1);
  ++stats_.collectives;
  if (size_ == 1) return {};
  return start([&](MpiPending& p) {
    split_counts(n, size_, p);
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data, p.counts.data(), p.displacements.data(),
                    MPI_FLOAT, comm_, &p.request);
  });
}

CommRequest MpiCommunicator::broadcast_async(Tensor data, int root) {
  const int n = count_of(data, name_ + " broadcast", size_);
  if (rank_ == root) stats_.collective_bytes += static_cast<int64_t>(data.bytes());
  ++stats_.collectives;
  if (size_ == 1) return {};
  return start([&](MpiPending& p) { MPI_Ibcast(data.data, n, MPI_FLOAT, root, comm_, &p.request); });
}

CommRequest MpiCommunicator::send_async(const Tensor& data, int peer, int tag) {
  const int n = count_of(data, name_ + " send", size_);
  stats_.p2p_bytes += static_cast<int64_t>(data.bytes());
  ++stats_.p2p_messages;
  return start([&](MpiPending& p) { MPI_Isend(data.data, n, MPI_FLOAT, peer, tag, comm_, &p.request); });
}

CommRequest MpiCommunicator::recv_async(Tensor data, int peer, int tag) {
  const int n = count_of(data, name_ + " recv", size_);
  return start([&](MpiPending& p) { MPI_Irecv(data.data, n, MPI_FLOAT, peer, tag, comm_, &p.request); });
}

void MpiCommunicator::all_reduce(std::span<double> values, ReduceOp op) {
  if (size_ == 1) return;
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, mpi_op(op), comm_);
}

void MpiCommunicator::all_reduce(std::span<int64_t> values, ReduceOp op) {
  if (size_ == 1) return;
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T, mpi_op(op), comm_);
}

void MpiCommunicator::barrier() { MPI_Barrier(comm_); }

}  // namespace hdp
