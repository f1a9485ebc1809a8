#pragma once
// One interface for every collective and point-to-point transfer the trainer
// makes. The MPI implementation (mpi_communicator.h) moves CPU buffers directly and
// device buffers through page-locked host staging; a NCCL implementation could move
// device buffers directly behind the same calls. Nothing above parallel/ calls MPI
// directly. Tensors may live on any device; callers never touch their elements on
// the host.

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "kernels/tensor.h"

namespace hdp {

enum class ReduceOp { Sum, Max };

// A non-blocking operation in flight. wait() blocks until it completed; the
// buffers it uses must stay untouched until then. An empty request is complete.
class CommRequest {
 public:
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  CommRequest() = default;
  explicit CommRequest(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  CommRequest(CommRequest&&) noexcept = default;
  CommRequest& operator=(CommRequest&& other) noexcept {
    wait();
    pending_ = std::move(other.pending_);
    return *this;
  }
  ~CommRequest() { wait(); }

  void wait() {
    if (pending_) {
      pending_->wait();
      pending_.reset();
    }
  }
  bool pending() const { return pending_ != nullptr; }

 private:
  std::unique_ptr<Pending> pending_;
};

// Bytes this rank put on the wire through one communicator. Point-to-point
// counts the payload; collectives count what a ring algorithm sends per rank:
// all-reduce 2(n-1)/n x bytes, reduce-scatter and all-gather (n-1)/n x the full buffer.
struct CommStats {
  int64_t p2p_bytes = 0;
  int64_t collective_bytes = 0;
  int64_t p2p_messages = 0;
  int64_t collectives = 0;
};

// Where part `part` of an even split of n elements into `parts` begins.
inline int64_t part_begin(int64_t n, int part, int parts) { return n * part / parts; }

// all_to_all_v's contract, checked by every implementation: one count per rank, none
// negative, and send / recv holding exactly their sums. Throws std::invalid_argument
// naming the group.
inline void check_all_to_all_counts(const std::string& group, int size, const Tensor& send,
                                    std::span<const int64_t> send_counts, const Tensor& recv,
                                    std::span<const int64_t> recv_counts) {
  auto check = [&](const char* what, const Tensor& t, std::span<const int64_t> counts) {
    if (static_cast<int>(counts.size()) != size)
      throw std::invalid_argument(group + " all-to-all: " + std::to_string(counts.size()) + " " + what +
                                  " counts for " + std::to_string(size) + " ranks");
    int64_t total = 0;
    for (int64_t c : counts) {
      if (c < 0) throw std::invalid_argument(group + " all-to-all: a negative " + what + " count");
      total += c;
    }
    if (total != t.numel())
      throw std::invalid_argument(group + " all-to-all: " + what + " counts sum to " + std::to_string(total) +
                                  ", the tensor holds " + std::to_string(t.numel()));
  };
  check("send", send, send_counts);
  check("recv", recv, recv_counts);
}

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What the group is for ("world", "tp", "pp", "hdp", ...), for messages.
  virtual const std::string& name() const = 0;

  // In place: every rank ends with the reduction of all ranks' data.
  virtual CommRequest all_reduce_async(Tensor data, ReduceOp op) = 0;
  // A buffer of n elements splits into size() parts, part r = [part_begin(n, r), part_begin(n, r + 1)).
  // recv (the size of part rank() of send) receives the sum over ranks of that part.
  virtual CommRequest reduce_scatter_async(const Tensor& send, Tensor recv) = 0;
  // In place: part rank() of buffer is this rank's input; afterwards every part
  // holds its owner's data.
  virtual CommRequest all_gather_async(Tensor buffer) = 0;
  // All-to-all with a size per peer (expert parallelism's token dispatch and combine):
  // `send` is send_counts[r] elements for each rank r, back to back in rank order;
  // `recv` receives recv_counts[r] elements from each rank r, back to back in rank
  // order, and recv_counts[r] must be what rank r sends to this rank. One count per
  // rank each; send and recv hold exactly the sums.
  virtual CommRequest all_to_all_v_async(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                                         std::span<const int64_t> recv_counts) = 0;
  virtual CommRequest send_async(const Tensor& data, int peer, int tag) = 0;
  virtual CommRequest recv_async(Tensor data, int peer, int tag) = 0;

  // Blocking reductions of small host-side values (losses, token counts, norms).
  virtual void all_reduce(std::span<double> values, ReduceOp op) = 0;
  virtual void all_reduce(std::span<int64_t> values, ReduceOp op) = 0;

  void all_reduce(Tensor data, ReduceOp op) { all_reduce_async(data, op).wait(); }
  void reduce_scatter(const Tensor& send, Tensor recv) { reduce_scatter_async(send, recv).wait(); }
  void all_gather(Tensor buffer) { all_gather_async(buffer).wait(); }
  void all_to_all_v(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                    std::span<const int64_t> recv_counts) {
    all_to_all_v_async(send, send_counts, recv, recv_counts).wait();
  }
  void send(const Tensor& data, int peer, int tag) { send_async(data, peer, tag).wait(); }
  void recv(Tensor data, int peer, int tag) { recv_async(data, peer, tag).wait(); }
  double all_reduce_sum(double value) {
    all_reduce(std::span<double>(&value, 1), ReduceOp::Sum);
    return value;
  }
  int64_t all_reduce_sum(int64_t value) {
    all_reduce(std::span<int64_t>(&value, 1), ReduceOp::Sum);
    return value;
  }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  CommStats stats_;
};

}  // namespace hdp
