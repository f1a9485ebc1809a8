#pragma once
// An in-process group for unit tests of collectives without MPI: each of `size`
// threads holds its rank's ThreadCommunicator over one shared ThreadGroup. Only
// what the tests need is real: the all-reduce of CPU tensors (summed in rank
// order, so every rank gets bit-identical results) and the all-to-all; every other
// transfer throws.

#include <algorithm>
#include <barrier>
#include <exception>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.h"

namespace hdp::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size)
      : size_(size), arrived_(size), buffers_(static_cast<size_t>(size)), counts_(static_cast<size_t>(size)) {}
  int size() const { return size_; }
  void leave() { arrived_.arrive_and_drop(); }

 private:
  friend class ThreadCommunicator;
  int size_;
  std::barrier<> arrived_;
  std::vector<Tensor> buffers_;  // each rank's buffer of the collective in flight
  std::vector<std::vector<int64_t>> counts_;  // each rank's send counts of the all-to-all in flight
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  const std::string& name() const override { return name_; }

  CommRequest all_reduce_async(Tensor data, ReduceOp op) override {
    if (data.device != Device::CPU) throw std::logic_error("thread communicator: CPU tensors only");
    group_.buffers_[static_cast<size_t>(rank_)] = data;
    group_.arrived_.arrive_and_wait();
    std::vector<float> reduced(static_cast<size_t>(data.numel()));
    for (int r = 0; r < size(); ++r) {
      const Tensor& b = group_.buffers_[static_cast<size_t>(r)];
      if (b.numel() != data.numel()) throw std::logic_error("thread communicator: all-reduce of different sizes");
      for (size_t i = 0; i < reduced.size(); ++i) {
        reduced[i] = r == 0 ? b.data[i] : op == ReduceOp::Sum ? reduced[i] + b.data[i] : std::max(reduced[i], b.data[i]);
      }
    }
    // Every rank has read every buffer before any rank overwrites its own.
    group_.arrived_.arrive_and_wait();
    std::copy(reduced.begin(), reduced.end(), data.data);
    ++stats_.collectives;
    return {};
  }
  CommRequest reduce_scatter_async(const Tensor&, Tensor) override { return unsupported("reduce-scatter"); }
  CommRequest all_gather_async(Tensor) override { return unsupported("all-gather"); }
  CommRequest all_to_all_v_async(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                                 std::span<const int64_t> recv_counts) override {
    if (send.device != Device::CPU || recv.device != Device::CPU)
      throw std::logic_error("thread communicator: CPU tensors only");
    check_all_to_all_counts(name_, size(), send, send_counts, recv, recv_counts);
    const size_t me = static_cast<size_t>(rank_);
    group_.buffers_[me] = send;
    group_.counts_[me].assign(send_counts.begin(), send_counts.end());
    group_.arrived_.arrive_and_wait();
    // From each rank q: its part for this rank, after its parts for the ranks before.
    int64_t at = 0;
    for (int q = 0; q < size(); ++q) {
      const std::vector<int64_t>& counts = group_.counts_[static_cast<size_t>(q)];
      if (counts[me] != recv_counts[static_cast<size_t>(q)])
        throw std::logic_error("thread communicator: all-to-all counts disagree between ranks");
      int64_t from = 0;
      for (int j = 0; j < rank_; ++j) from += counts[static_cast<size_t>(j)];
      const float* src = group_.buffers_[static_cast<size_t>(q)].data + from;
      std::copy(src, src + counts[me], recv.data + at);
      at += counts[me];
    }
    // Every rank has read every buffer before any rank reuses its own.
    group_.arrived_.arrive_and_wait();
    ++stats_.collectives;
    return {};
  }
  CommRequest send_async(const Tensor&, int, int) override { return unsupported("send"); }
  CommRequest recv_async(Tensor, int, int) override { return unsupported("recv"); }
  void all_reduce(std::span<double>, ReduceOp) override { unsupported("all-reduce of host values"); }
  void all_reduce(std::span<int64_t>, ReduceOp) override { unsupported("all-reduce of host values"); }
  using Communicator::all_reduce;

 private:
  CommRequest unsupported(const char* what) const {
    throw std::logic_error(std::string("thread communicator: no ") + what);
  }
  ThreadGroup& group_;
  int rank_;
  std::string name_ = "tp";
};

// Runs body(communicator) on `size` threads, one per rank, and rethrows the first
// exception any of them threw. Every rank must make the same collectives: check
// with EXPECT_*, whose failures do not leave the body. A rank that throws leaves
// the group so that the others do not wait for it forever.
inline void run_ranks(int size, const std::function<void(ThreadCommunicator&)>& body) {
  ThreadGroup group(size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(group, r);
      try {
        body(comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        group.leave();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace hdp::testing
