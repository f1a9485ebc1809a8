#pragma once
// Communicator over an MPI communicator. Host buffers go to MPI as they are;
// device buffers are staged through page-locked host memory (see below). In
// collectives bf16 tensors go through fp32 staging blocks (their elements travel as
// MPI_FLOAT, so reductions sum in fp32); point-to-point messages travel in their own
// dtype, bf16 as its 16 bits (MPI_UINT16_T): a send reduces nothing, so the bytes
// arrive as they left, in half the bytes of fp32 (ring attention's key/value rows,
// pipeline activations). A receive expects the dtype of its message: a bf16 message
// into an fp32 receive arrives as the wrong count, an error naming both.
// Communicators it owns (every one but MPI_COMM_WORLD's) return MPI's errors, and
// each call checks them: a failure, e.g. a receive of another size than its message,
// throws naming the group, the operation and the peer.

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace hdp {

// Page-locked host blocks that device buffers are staged through, owned by one
// communicator (and kept alive by the requests still using them). Blocks come in
// power-of-two size classes (4 KiB and up) and go back to their class's free list
// when the request that used them completes; a new block is allocated only when a
// class has none free. A training step repeats the same transfers, so the pool
// grows during the first step (and when a later batch needs a larger class, e.g.
// a longer ring message) and steady-state steps allocate no pinned memory. Blocks
// are freed with the communicator. Thread-safe.
class StagingPool;

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
  int max_tag() const override { return max_tag_; }
  MPI_Comm handle() const { return comm_; }
  // The MPI_COMM_WORLD rank of member `rank` of this communicator.
  int world_rank(int rank) const { return rank >= 0 && rank < size_ ? world_ranks_[rank] : -1; }

  // Device buffers (Device::CUDA) work in every call: an input is copied to a
  // staging block before the MPI call starts (so the caller may reuse it at once),
  // an output is copied back from its block in wait(). The copies run on the
  // device's compute stream and synchronise it, so they see all work enqueued
  // before the call. Groups of one move no data (reduce-scatter copies on the device).
  CommRequest all_reduce_async(Tensor data, ReduceOp op) override;
  CommRequest reduce_scatter_async(const Tensor& send, Tensor recv) override;
  CommRequest all_gather_async(Tensor buffer) override;
  CommRequest all_to_all_v_async(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                                 std::span<const int64_t> recv_counts) override;
  CommRequest send_async(const Tensor& data, int peer, int tag) override;
  CommRequest recv_async(Tensor data, int peer, int tag) override;
  void all_reduce(std::span<double> values, ReduceOp op) override;
  void all_reduce(std::span<int64_t> values, ReduceOp op) override;
  using Communicator::all_reduce;

  // Staging pool: bytes held (pinned or, in the test mode below, ordinary host
  // memory) and how many blocks were ever allocated.
  size_t staging_bytes() const;
  int64_t staging_allocations() const;
  // For tests on machines without a GPU: send host buffers through the staging
  // path too (blocks are then ordinary host memory), so that it is exercised.
  void stage_host_buffers_for_testing(bool on) { stage_host_ = on; }

 private:
  // Whether `t` goes through a staging block: device memory, and bf16 tensors, which
  // travel as fp32 (widened exactly into the block, rounded once on the way back, so
  // an all-reduce sums bf16 contributions in fp32).
  bool staged(const Tensor& t) const { return t.device != Device::CPU || stage_host_ || t.dtype != DType::F32; }
  // Whether a point-to-point message goes through a staging block: device memory
  // only (its bytes are copied as they are).
  bool staged_message(const Tensor& t) const { return t.device != Device::CPU || stage_host_; }
  // Messages carry fp32 or bf16 (index tensors are not Tensors); anything else throws.
  void check_message_dtype(const Tensor& t, const char* op) const;

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  int max_tag_ = kGuaranteedMaxTag;  // MPI_TAG_UB
  std::vector<int> world_ranks_;  // world_rank()
  std::shared_ptr<StagingPool> staging_;
  bool stage_host_ = false;
};

}  // namespace hdp
