#pragma once
// One interface for every collective and point-to-point transfer the trainer
// makes. The MPI implementation (mpi_communicator.h) moves CPU buffers directly and
// device buffers through page-locked host staging; the NCCL implementation
// (nccl_communicator.h, CUDA builds) moves device buffers directly behind the same
// calls. Nothing above parallel/ calls MPI or NCCL directly. Tensors may live on any
// device; callers never touch their elements on the host. tests/communicator_conformance.h
// is the one set of tests every implementation passes.

#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"

namespace hdp {

enum class ReduceOp { Sum, Max };

// A non-blocking operation in flight. wait() returns when the operation's results
// may be used and its buffers reused by the work that follows: for host buffers
// (MPI) that is when it completed; for device buffers under NCCL it is when the
// device's compute stream has been made to wait for it (nothing blocks the host),
// so later ops on that stream see the data. An empty request is complete.
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
      // Reset first: a wait() that throws (a mismatched message) leaves the request complete.
      std::unique_ptr<Pending> pending = std::move(pending_);
      pending->wait();
    }
  }
  bool pending() const { return pending_ != nullptr; }

  // One request for several: wait() waits for each in order (none: complete); when
  // one fails it still waits for the others (whose buffers are in use until then)
  // and then rethrows the first error.
  static CommRequest all(std::vector<CommRequest> requests);

 private:
  std::unique_ptr<Pending> pending_;
};

inline CommRequest CommRequest::all(std::vector<CommRequest> requests) {
  if (requests.empty()) return {};
  class All final : public Pending {
   public:
    explicit All(std::vector<CommRequest> r) : requests_(std::move(r)) {}
    void wait() override {
      std::exception_ptr first;
      for (CommRequest& r : requests_) {
        try {
          r.wait();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
      if (first) std::rethrow_exception(first);
    }

   private:
    std::vector<CommRequest> requests_;
  };
  return CommRequest(std::make_unique<All>(std::move(requests)));
}

// Bytes this rank put on the wire through one communicator. Point-to-point
// counts the payload of each send; collectives count what a ring algorithm sends
// per rank (ring_collective_bytes): all-reduce 2(n-1)/n x bytes, reduce-scatter and
// all-gather (n-1)/n x the full buffer, all-to-all what leaves the rank. Bytes are those of the elements as they
// travel: MPI's collectives move every element as fp32 (bf16 is widened for the
// wire, so reductions sum in fp32) and its point-to-point messages move bf16 as
// bf16; NCCL moves bf16 as bf16 everywhere.
struct CommStats {
  int64_t p2p_bytes = 0;
  int64_t collective_bytes = 0;
  int64_t p2p_messages = 0;
  int64_t collectives = 0;
};

// What one rank of `ranks` sends in a ring collective over a buffer of `bytes`:
// passes x (n-1)/n x bytes (all-reduce makes 2 passes, reduce-scatter and
// all-gather 1; Patarasuk & Yuan 2009). Nothing for a group of one.
inline int64_t ring_collective_bytes(int64_t bytes, int ranks, int passes) {
  return ranks <= 1 ? 0 : passes * bytes * (ranks - 1) / ranks;
}

// Where part `part` of an even split of n elements into `parts` begins.
inline int64_t part_begin(int64_t n, int part, int parts) { return n * part / parts; }

// all_to_all_v's contract, checked by every implementation: one count per rank, none
// negative, send / recv holding exactly their sums, and one dtype. Throws
// std::invalid_argument naming the group.
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
  if (send.dtype != recv.dtype)
    throw std::invalid_argument(group + " all-to-all: sends " + dtype_name(send.dtype) + " into a " +
                                dtype_name(recv.dtype) + " receive");
}

// Why a reduce-scatter receive of `received` elements is not part `rank` of a buffer
// of n elements split over `ranks` (empty when it is): every implementation refuses
// such a call before anything moves, with this message.
inline std::string reduce_scatter_part_error(const std::string& group, int rank, int ranks, int64_t n, int64_t received) {
  const int64_t part = part_begin(n, rank + 1, ranks) - part_begin(n, rank, ranks);
  if (received == part) return {};
  return group + " reduce-scatter: rank " + std::to_string(rank) + " receives " + std::to_string(received) +
         " elements, its part of " + std::to_string(n) + " has " + std::to_string(part);
}

// The largest message tag every MPI implementation accepts: the MPI standard
// guarantees MPI_TAG_UB >= 32767 ("Tag values", among its environmental
// inquiries); OpenMPI's ob1 allows 2^31 - 1, other transports less. Constant tags
// stay below it; computed ones are checked against Communicator::max_tag().
inline constexpr int kGuaranteedMaxTag = 32767;

// One message of a grouped exchange (Communicator::exchange): what to send to
// `peer`, or where to receive what `peer` sends, matched by tag as send/recv are.
struct Transfer {
  Tensor data;
  int peer = -1;
  int tag = 0;
};

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
  // A receive must be as large as the message it matches; a receive of another size
  // is an error naming the group, the peer and both sizes (thrown by wait()).
  // Messages of one peer and tag match in order, as MPI's do (non-overtaking, MPI
  // standard section 3.5): the k-th receive posted gets the k-th message sent. A
  // tag outside [0, max_tag()] is refused (check_tag) before anything is posted.
  virtual CommRequest send_async(const Tensor& data, int peer, int tag) = 0;
  virtual CommRequest recv_async(Tensor data, int peer, int tag) = 0;
  // The sends and receives of one step of a pattern in which ranks both send and
  // receive (ring attention's key/value rows and their gradients), posted as one
  // unit. Where operations run in issue order on a stream (NCCL), two ranks that
  // each receive before they send would wait for each other; posted together they
  // run as one group (ncclGroupStart/End), as ByteScale (Ge et al. 2025, section
  // 5.1) runs its ring exchanges. Every rank that takes part calls it at the same
  // point of its sequence of operations on this communicator. Completes when all
  // have. Default: the receives, then the sends, each posted on its own.
  virtual CommRequest exchange(std::span<const Transfer> sends, std::span<const Transfer> receives) {
    std::vector<CommRequest> requests;
    requests.reserve(sends.size() + receives.size());
    for (const Transfer& r : receives) requests.push_back(recv_async(r.data, r.peer, r.tag));
    for (const Transfer& s : sends) requests.push_back(send_async(s.data, s.peer, s.tag));
    return CommRequest::all(std::move(requests));
  }

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

  // The largest tag a message may carry (MPI: the communicator's MPI_TAG_UB).
  // Default: what every MPI allows.
  virtual int max_tag() const { return kGuaranteedMaxTag; }

 protected:
  // Throws std::invalid_argument, naming the group, the operation and the peer, for
  // a tag outside [0, max_tag()].
  void check_tag(int tag, const char* op, int peer) const {
    if (tag < 0 || tag > max_tag())
      throw std::invalid_argument(name() + " " + op + " rank " + std::to_string(peer) + ": tag " +
                                  std::to_string(tag) + " is outside 0.." + std::to_string(max_tag()) +
                                  " (the communicator's largest tag)");
  }
  CommStats stats_;
};

}  // namespace hdp
