#pragma once
// A communicator that needs no MPI. With one rank, collectives are identities and
// point-to-point is an error: for single-process tools and tests. It can also
// pose as rank r of a larger group that never communicates, so that tools can
// lay out that rank's shards (any transfer then throws). Its statistics count
// what a group of one sends: collectives, and no bytes.

#include <stdexcept>

#include "kernels/ops.h"
#include "parallel/communicator.h"

namespace hdp {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name = "local", int rank = 0, int size = 1)
      : name_(std::move(name)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  CommRequest all_reduce_async(Tensor, ReduceOp) override { return single("all-reduce"); }
  CommRequest reduce_scatter_async(const Tensor& send, Tensor recv) override {
    single("reduce-scatter");
    const std::string error = reduce_scatter_part_error(name_, rank_, size_, send.numel(), recv.numel());
    if (!error.empty()) throw std::invalid_argument(error);
    if (recv.numel() > 0) copy(recv, send);
    return {};
  }
  CommRequest all_gather_async(Tensor) override { return single("all-gather"); }
  CommRequest all_to_all_v_async(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                                 std::span<const int64_t> recv_counts) override {
    single("all-to-all");
    check_all_to_all_counts(name_, size_, send, send_counts, recv, recv_counts);
    if (send.numel() != recv.numel())
      throw std::invalid_argument(name_ + " all-to-all: one rank receives what it sends, " +
                                  std::to_string(send.numel()) + " elements, not " + std::to_string(recv.numel()));
    if (send.numel() > 0) copy(recv, send);
    return {};
  }
  CommRequest send_async(const Tensor&, int, int) override { throw std::logic_error(name_ + ": no peer to send to"); }
  CommRequest recv_async(Tensor, int, int) override { throw std::logic_error(name_ + ": no peer to receive from"); }
  void all_reduce(std::span<double>, ReduceOp) override { require_single("all-reduce"); }
  void all_reduce(std::span<int64_t>, ReduceOp) override { require_single("all-reduce"); }
  using Communicator::all_reduce;

 private:
  void require_single(const char* what) const {
    if (size_ != 1) throw std::logic_error(name_ + ": " + what + " across " + std::to_string(size_) + " ranks needs a real communicator");
  }
  // A collective on tensors, counted as the other implementations count it.
  CommRequest single(const char* what) {
    require_single(what);
    ++stats_.collectives;
    return {};
  }
  std::string name_;
  int rank_;
  int size_;
};

}  // namespace hdp
