#pragma once
// Communicator over an MPI communicator and CPU buffers.

#include <mpi.h>

#include "parallel/communicator.h"

namespace hdp {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction unless it is MPI_COMM_WORLD).
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  // The ranks with the same color form one new communicator, ordered by key.
  // color < 0 means this rank joins none and gets nullptr.
  std::unique_ptr<MpiCommunicator> split(int color, int key, std::string name) const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm handle() const { return comm_; }

  CommRequest all_reduce_async(Tensor data, ReduceOp op) override;
  CommRequest reduce_scatter_async(const Tensor& send, Tensor recv) override;
  CommRequest all_gather_async(Tensor buffer) override;
  CommRequest broadcast_async(Tensor data, int root) override;
  CommRequest send_async(const Tensor& data, int peer, int tag) override;
  CommRequest recv_async(Tensor data, int peer, int tag) override;
  void all_reduce(std::span<double> values, ReduceOp op) override;
  void all_reduce(std::span<int64_t> values, ReduceOp op) override;
  void barrier() override;
  using Communicator::all_reduce;

 private:
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace hdp
