#pragma once
// An in-process group for unit tests without MPI: each of `size` threads holds its
// rank's ThreadCommunicator over one shared ThreadGroup. Every call of the
// Communicator interface is real for CPU tensors (fp32 or bf16): collectives
// reduce in fp32 in rank order (bit-identical on every rank; bf16 rounded once on
// the way back, as the MPI communicator's staging does), the all-to-all copies each
// rank's parts out of the others' send buffers, sends are buffered (a
// send completes at once, a receive waits for its message, matched by peer and
// tag in order, as MPI matches them). It passes the communicator conformance
// suite (tests/communicator_conformance.h).

#include <algorithm>
#include <barrier>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "parallel/communicator.h"

namespace hdp::testing {

class ThreadGroup {
 public:
  // max_tag: the largest tag its messages may carry (a small one stands for a
  // transport whose MPI_TAG_UB is low).
  explicit ThreadGroup(int size, int max_tag = INT_MAX)
      : size_(size),
        max_tag_(max_tag),
        arrived_(size),
        posted_(static_cast<size_t>(size)),
        left_(static_cast<size_t>(size)) {}
  int size() const { return size_; }
  int max_tag() const { return max_tag_; }
  // A rank that failed outside a collective leaves: the collective the others are in
  // (or enter next) fails with this error instead of reading its stale contribution.
  void leave(int rank) {
    posted_[static_cast<size_t>(rank)] = Contribution{};
    posted_[static_cast<size_t>(rank)].error = "rank " + std::to_string(rank) + " left the group (it failed)";
    arrived_.arrive_and_drop();
    {
      // A receive from it that is still waiting fails too, instead of waiting forever.
      std::lock_guard<std::mutex> lock(mail_mutex_);
      left_[static_cast<size_t>(rank)] = true;
    }
    mail_arrived_.notify_all();
  }

 private:
  friend class ThreadCommunicator;
  // What each rank brings to the collective in flight.
  struct Contribution {
    Tensor data;               // the tensor (all-reduce, all-gather) or the send buffer (reduce-scatter)
    std::vector<double> doubles;  // host values (all-reduce)
    std::vector<int64_t> integers;
    size_t host_count() const { return doubles.size() + integers.size(); }
    std::string op;            // the collective, so that mismatched calls are found
    std::vector<int64_t> counts, recv_counts;  // all-to-all: elements to and from each rank (sizes differ by rank)
    std::string error;         // this rank's call is invalid (a wrong receive size)
  };
  struct Message {
    std::vector<char> bytes;
    int64_t numel = 0;
    DType dtype = DType::F32;
  };
  // The messages of one (from, to, tag): the k-th receive posted takes the k-th sent,
  // as MPI matches them (non-overtaking), whatever order the receives are waited in.
  struct Mailbox {
    int64_t sent = 0, posted = 0;
    std::map<int64_t, Message> waiting;  // by number, sent and not yet received
  };
  int size_;
  int max_tag_;
  std::barrier<> arrived_;
  std::vector<Contribution> posted_;
  std::mutex mail_mutex_;
  std::condition_variable mail_arrived_;
  std::map<std::tuple<int, int, int>, Mailbox> mail_;  // by (from, to, tag)
  std::vector<bool> left_;                               // by rank: it left the group (leave)
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank, std::string name = "tp")
      : group_(group), rank_(rank), name_(std::move(name)) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  const std::string& name() const override { return name_; }
  int max_tag() const override { return group_.max_tag(); }

  CommRequest all_reduce_async(Tensor data, ReduceOp op) override {
    host_tensor(data, "all-reduce");
    stats_.collective_bytes += ring_collective_bytes(wire_bytes(data), size(), 2);
    ++stats_.collectives;
    std::vector<float> reduced;
    collective("all-reduce", tensor_call(data, "all-reduce"), [&] { reduced = reduce_part(0, data.numel(), op); });
    store(data, 0, reduced);  // in place: only once every rank has read every buffer
    return {};
  }

  CommRequest reduce_scatter_async(const Tensor& send, Tensor recv) override {
    host_tensor(send, "reduce-scatter");
    host_tensor(recv, "reduce-scatter");
    const int64_t n = send.numel(), begin = part_begin(n, rank_, size()), end = part_begin(n, rank_ + 1, size());
    const std::string error = reduce_scatter_part_error(name_, rank_, size(), n, recv.numel());
    stats_.collective_bytes += ring_collective_bytes(wire_bytes(send), size(), 1);
    ++stats_.collectives;
    collective("reduce-scatter", tensor_call(send, "reduce-scatter", error), [&] {
      std::vector<float> reduced = reduce_part(begin, end, ReduceOp::Sum);
      store(recv, 0, reduced);
    });
    return {};
  }

  CommRequest all_gather_async(Tensor buffer) override {
    host_tensor(buffer, "all-gather");
    stats_.collective_bytes += ring_collective_bytes(wire_bytes(buffer), size(), 1);
    ++stats_.collectives;
    collective("all-gather", tensor_call(buffer, "all-gather"), [&] {
      const int64_t n = buffer.numel();
      const size_t element = buffer.element_size();
      for (int r = 0; r < size(); ++r) {
        if (r == rank_) continue;
        const int64_t begin = part_begin(n, r, size()), end = part_begin(n, r + 1, size());
        // Part r of rank r's buffer is its input, which no rank writes during the call.
        std::memcpy(static_cast<char*>(buffer.raw()) + begin * element,
                    static_cast<const char*>(group_.posted_[static_cast<size_t>(r)].data.raw()) + begin * element,
                    static_cast<size_t>(end - begin) * element);
      }
    });
    return {};
  }

  CommRequest all_to_all_v_async(const Tensor& send, std::span<const int64_t> send_counts, Tensor recv,
                                 std::span<const int64_t> recv_counts) override {
    host_tensor(send, "all-to-all");
    host_tensor(recv, "all-to-all");
    check_all_to_all_counts(name_, size(), send, send_counts, recv, recv_counts);
    ThreadGroup::Contribution mine = tensor_call(send, "all-to-all");
    mine.counts.assign(send_counts.begin(), send_counts.end());
    mine.recv_counts.assign(recv_counts.begin(), recv_counts.end());
    // What leaves this rank, each element as fp32 (wire_bytes), as the MPI communicator counts it.
    stats_.collective_bytes += (send.numel() - send_counts[static_cast<size_t>(rank_)]) * static_cast<int64_t>(sizeof(float));
    ++stats_.collectives;
    std::string error;
    collective("all-to-all", std::move(mine), [&] {
      // Every rank checks the whole count matrix, so all of them fail alike (the
      // dtypes agree: collective() checked them).
      for (int q = 0; q < size() && error.empty(); ++q) {
        for (int r = 0; r < size(); ++r) {
          const int64_t sent = group_.posted_[static_cast<size_t>(q)].counts[static_cast<size_t>(r)];
          const int64_t expected = group_.posted_[static_cast<size_t>(r)].recv_counts[static_cast<size_t>(q)];
          if (sent != expected) {
            error = name_ + " all-to-all: rank " + std::to_string(q) + " sends " + std::to_string(sent) +
                    " elements to rank " + std::to_string(r) + ", which expects " + std::to_string(expected);
            break;
          }
        }
      }
      if (!error.empty()) return;
      // From each rank q: its part for this rank, after its parts for the ranks before.
      const size_t me = static_cast<size_t>(rank_), element = recv.element_size();
      int64_t at = 0;
      for (int q = 0; q < size(); ++q) {
        const ThreadGroup::Contribution& c = group_.posted_[static_cast<size_t>(q)];
        int64_t from = 0;
        for (int j = 0; j < rank_; ++j) from += c.counts[static_cast<size_t>(j)];
        std::memcpy(static_cast<char*>(recv.raw()) + at * element,
                    static_cast<const char*>(c.data.raw()) + from * element, static_cast<size_t>(c.counts[me]) * element);
        at += c.counts[me];
      }
    });
    if (!error.empty()) throw std::runtime_error(error);
    return {};
  }

  CommRequest send_async(const Tensor& data, int peer, int tag) override {
    host_tensor(data, "send");
    check_peer(peer, "send to");
    check_tag(tag, "send to", peer);
    ThreadGroup::Message m;
    m.bytes.assign(static_cast<const char*>(data.raw()), static_cast<const char*>(data.raw()) + data.bytes());
    m.numel = data.numel();
    m.dtype = data.dtype;
    stats_.p2p_bytes += static_cast<int64_t>(data.bytes());  // messages travel in their own dtype, as MPI's
    ++stats_.p2p_messages;
    {
      std::lock_guard<std::mutex> lock(group_.mail_mutex_);
      ThreadGroup::Mailbox& box = group_.mail_[{rank_, peer, tag}];
      box.waiting.emplace(box.sent++, std::move(m));
    }
    group_.mail_arrived_.notify_all();
    return {};
  }

  CommRequest recv_async(Tensor data, int peer, int tag) override {
    host_tensor(data, "recv");
    check_peer(peer, "recv from");
    check_tag(tag, "recv from", peer);
    class Receive final : public CommRequest::Pending {
     public:
      Receive(ThreadCommunicator& comm, Tensor data, int peer, int tag) : comm_(comm), data_(data), peer_(peer), tag_(tag) {
        std::lock_guard<std::mutex> lock(comm.group_.mail_mutex_);
        number_ = comm.group_.mail_[{peer, comm.rank_, tag}].posted++;
      }
      void wait() override {
        ThreadGroup& g = comm_.group_;
        std::unique_lock<std::mutex> lock(g.mail_mutex_);
        std::map<int64_t, ThreadGroup::Message>& waiting = g.mail_[{peer_, comm_.rank_, tag_}].waiting;
        g.mail_arrived_.wait(lock, [&] { return waiting.contains(number_) || g.left_[static_cast<size_t>(peer_)]; });
        const auto it = waiting.find(number_);
        if (it == waiting.end())
          throw std::runtime_error(comm_.name_ + " recv from rank " + std::to_string(peer_) + " (tag " +
                                   std::to_string(tag_) + "): rank " + std::to_string(peer_) +
                                   " left the group (it failed)");
        ThreadGroup::Message m = std::move(it->second);
        waiting.erase(it);
        lock.unlock();
        if (m.numel != data_.numel() || m.dtype != data_.dtype) {
          throw std::runtime_error(comm_.name_ + " recv from rank " + std::to_string(peer_) + " (tag " +
                                   std::to_string(tag_) + "): " + std::to_string(m.numel) + " " + dtype_name(m.dtype) +
                                   " elements arrived, the receive holds " + std::to_string(data_.numel()) + " " +
                                   dtype_name(data_.dtype));
        }
        if (!m.bytes.empty()) std::memcpy(data_.raw(), m.bytes.data(), m.bytes.size());
      }

     private:
      ThreadCommunicator& comm_;
      Tensor data_;
      int peer_, tag_;
      int64_t number_ = 0;  // this receive's place among those of its (peer, tag)
    };
    return CommRequest(std::make_unique<Receive>(*this, data, peer, tag));
  }

  void all_reduce(std::span<double> values, ReduceOp op) override { reduce_host(values, op); }
  void all_reduce(std::span<int64_t> values, ReduceOp op) override { reduce_host(values, op); }
  using Communicator::all_reduce;

 private:
  static ThreadGroup::Contribution tensor_call(const Tensor& t, const char* op, std::string error = {}) {
    ThreadGroup::Contribution c;
    c.data = t;
    c.op = op;
    c.error = std::move(error);
    return c;
  }
  // Every element travels as fp32, as in the MPI communicator, so the byte counts agree.
  static int64_t wire_bytes(const Tensor& t) { return t.numel() * static_cast<int64_t>(sizeof(float)); }

  void host_tensor(const Tensor& t, const char* op) const {
    if (t.device != Device::CPU || (t.dtype != DType::F32 && t.dtype != DType::BF16)) {
      throw std::logic_error(name_ + " " + op + ": the thread communicator takes fp32 or bf16 CPU tensors, not " +
                             dtype_name(t.dtype) + " on " + device_name(t.device));
    }
  }
  void check_peer(int peer, const char* op) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      throw std::invalid_argument(name_ + " " + op + " rank " + std::to_string(peer) + ": not another rank of " +
                                  std::to_string(size()));
    }
  }

  static float element(const Tensor& t, int64_t i) {
    return t.dtype == DType::BF16 ? to_float(t.bf16_data()[i]) : t.data[i];
  }
  static void store(const Tensor& t, int64_t offset, const std::vector<float>& values) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (t.dtype == DType::BF16) {
        t.bf16_data()[offset + static_cast<int64_t>(i)] = to_bf16(values[i]);
      } else {
        t.data[offset + static_cast<int64_t>(i)] = values[i];
      }
    }
  }
  // Elements [begin, end) reduced over the ranks' posted tensors, in rank order.
  std::vector<float> reduce_part(int64_t begin, int64_t end, ReduceOp op) const {
    std::vector<float> reduced(static_cast<size_t>(end - begin));
    for (int r = 0; r < size(); ++r) {
      const Tensor& b = group_.posted_[static_cast<size_t>(r)].data;
      for (int64_t i = begin; i < end; ++i) {
        const float x = element(b, i);
        float& y = reduced[static_cast<size_t>(i - begin)];
        y = r == 0 ? x : op == ReduceOp::Sum ? y + x : std::max(y, x);
      }
    }
    return reduced;
  }

  // Posts this rank's contribution, checks that every rank made the same call with
  // tensors of one size and dtype (else every rank throws the same error), runs
  // `body` and waits until every rank has read what it needs.
  template <class Body>
  void collective(const char* op, ThreadGroup::Contribution mine, Body body) {
    group_.posted_[static_cast<size_t>(rank_)] = std::move(mine);
    group_.arrived_.arrive_and_wait();
    // This rank's own error first, else the first rank's.
    std::string error = group_.posted_[static_cast<size_t>(rank_)].error;
    const ThreadGroup::Contribution& first = group_.posted_[0];
    for (int r = 0; r < size() && error.empty(); ++r) {
      const ThreadGroup::Contribution& c = group_.posted_[static_cast<size_t>(r)];
      if (!c.error.empty()) {
        error = c.error;
      } else if (c.op != first.op) {
        error = name_ + " " + op + ": rank " + std::to_string(r) + " called " + c.op + ", rank 0 " + first.op;
      } else if (c.data.dtype != first.data.dtype ||
                 (c.counts.empty() && (c.data.numel() != first.data.numel() || c.host_count() != first.host_count()))) {
        error = name_ + " " + op + ": rank " + std::to_string(r) + " has " +
                std::to_string(c.data.numel() + static_cast<int64_t>(c.host_count())) +
                " elements, rank 0 " +
                std::to_string(first.data.numel() + static_cast<int64_t>(first.host_count()));
      }
    }
    if (error.empty()) body();
    // Every rank has read every buffer before any rank overwrites its own or posts again.
    group_.arrived_.arrive_and_wait();
    if (!error.empty()) throw std::runtime_error(error);
  }

  static void host_values(ThreadGroup::Contribution& c, std::span<double> v) { c.doubles.assign(v.begin(), v.end()); }
  static void host_values(ThreadGroup::Contribution& c, std::span<int64_t> v) { c.integers.assign(v.begin(), v.end()); }
  template <class T>
  static const std::vector<T>& host_values(const ThreadGroup::Contribution& c) {
    if constexpr (std::is_same_v<T, double>) {
      return c.doubles;
    } else {
      return c.integers;
    }
  }

  template <class T>
  void reduce_host(std::span<T> values, ReduceOp op) {
    ThreadGroup::Contribution mine;
    mine.op = "all-reduce of host values";
    host_values(mine, values);
    collective("all-reduce of host values", std::move(mine), [&] {
      for (size_t i = 0; i < values.size(); ++i) {
        T y{};
        for (int r = 0; r < size(); ++r) {
          const T x = host_values<T>(group_.posted_[static_cast<size_t>(r)])[i];
          y = r == 0 ? x : op == ReduceOp::Sum ? y + x : std::max(y, x);
        }
        values[i] = y;
      }
    });
  }

  ThreadGroup& group_;
  int rank_;
  std::string name_;
};

// Runs body(communicator) on `size` threads, one per rank, and rethrows the first
// exception any of them threw. Every rank must make the same collectives: check
// with EXPECT_*, whose failures do not leave the body. A rank that throws leaves
// the group so that the others do not wait for it forever. max_tag: the group's
// largest message tag.
inline void run_ranks(int size, const std::function<void(ThreadCommunicator&)>& body, int max_tag = INT_MAX) {
  ThreadGroup group(size, max_tag);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(group, r);
      try {
        body(comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        group.leave(r);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace hdp::testing
