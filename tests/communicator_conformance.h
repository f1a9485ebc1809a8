#pragma once
// The communicator conformance suite: one set of tests that every implementation
// of the Communicator interface (parallel/communicator.h) passes. A test program
// instantiates it for its backends:
//
//   INSTANTIATE_TYPED_TEST_SUITE_P(Thread, CommunicatorConformance, ThreadBackend);
//
// tests/parallel_communicator_conformance_test.cpp: the thread and local
// communicators; tests/mpi_communicator_conformance_test.cpp (under mpirun): MPI
// with host buffers, host buffers through its staging path, the guarded test
// device's buffers, CUDA buffers, and NCCL (the last two only where a GPU is).
//
// A backend is a type with
//   static std::string unavailable();  // why it cannot run here ("" when it can)
//   static int max_ranks();            // the largest group it can form
//   static Device device();            // where its tensors live
//   static constexpr bool kDetectsMismatchedCollectives;  // collectives of different sizes across ranks
//   static void run(int ranks, const std::function<void(Communicator&)>& body);
// run() calls body on each rank of a fresh group of `ranks` (threads, or the first
// `ranks` MPI processes; the others skip it). Every test runs on each group size
// from 1 (or 2, for point-to-point) to min(4, max_ranks()), with values that make
// every result exact, so results are compared for equality.

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/communicator.h"

namespace hdp::testing {

// Tensors of a backend's device for one rank, filled and read through host vectors.
class ConformanceBuffers {
 public:
  explicit ConformanceBuffers(Device device) : arena_(device, 8 << 20, "conformance") {}
  Tensor make(int64_t n, DType dtype = DType::F32) { return arena_.tensor({n}, dtype); }
  Tensor make(const std::vector<float>& values, DType dtype = DType::F32) {
    Tensor t = make(static_cast<int64_t>(values.size()), dtype);
    set(t, values);
    return t;
  }
  static void set(Tensor t, std::vector<float> values) {
    if (t.numel() == 0) return;
    copy(t, Tensor(values.data(), {static_cast<int64_t>(values.size())}));
  }
  static std::vector<float> get(const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    if (t.numel() == 0) return out;
    copy(Tensor(out.data(), {t.numel()}), t);
    synchronize(t.device);
    return out;
  }

 private:
  Arena arena_;
};

template <class Backend>
class CommunicatorConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = Backend::unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  // Runs body(comm, buffers) on every group size from `min_ranks` up; skips when none fits.
  void for_each_size(int min_ranks, const std::function<void(Communicator&, ConformanceBuffers&)>& body) {
    const int most = std::min(4, Backend::max_ranks());
    if (most < min_ranks) GTEST_SKIP() << "needs " << min_ranks << " ranks, this backend forms groups of at most " << most;
    for (int ranks = min_ranks; ranks <= most; ++ranks) {
      SCOPED_TRACE("group of " + std::to_string(ranks));
      Backend::run(ranks, [&](Communicator& comm) {
        ASSERT_EQ(comm.size(), ranks);
        ConformanceBuffers buffers(Backend::device());
        body(comm, buffers);
      });
    }
  }
};

TYPED_TEST_SUITE_P(CommunicatorConformance);

// The owner of element i of an even split of n over `parts` (Communicator::part_begin).
inline int owner_of(int64_t i, int64_t n, int parts) {
  int owner = 0;
  while (part_begin(n, owner + 1, parts) <= i) ++owner;
  return owner;
}

TYPED_TEST_P(CommunicatorConformance, AllReduceSumAndMax) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size();
    std::vector<float> mine(7);
    for (int i = 0; i < 7; ++i) mine[i] = static_cast<float>(100 * r + i);
    Tensor sum = b.make(mine);
    comm.all_reduce_async(sum, ReduceOp::Sum).wait();
    const std::vector<float> got = b.get(sum);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(got[i], 100.0f * n * (n - 1) / 2 + static_cast<float>(n * i)) << i;

    // The maximum comes from a different rank for each element, negative values included.
    std::vector<float> values(5);
    for (int i = 0; i < 5; ++i) values[i] = (i % n == r) ? static_cast<float>(10 + i) : static_cast<float>(-20 - r);
    Tensor max = b.make(values);
    comm.all_reduce(max, ReduceOp::Max);
    const std::vector<float> maxima = b.get(max);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(maxima[i], static_cast<float>(10 + i)) << i;
  });
}

TYPED_TEST_P(CommunicatorConformance, AllReduceOfBf16Tensors) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size();
    // Small integers: every partial sum is exact in bf16 and in fp32.
    std::vector<float> mine = {1.0f + r, -2.0f * r, 0.5f, 8.0f * r};
    Tensor t = b.make(mine, DType::BF16);
    comm.all_reduce(t, ReduceOp::Sum);
    const std::vector<float> got = b.get(t);
    EXPECT_EQ(got[0], static_cast<float>(n + n * (n - 1) / 2));
    EXPECT_EQ(got[1], static_cast<float>(-n * (n - 1)));
    EXPECT_EQ(got[2], 0.5f * n);
    EXPECT_EQ(got[3], static_cast<float>(4 * n * (n - 1)));
  });
}

TYPED_TEST_P(CommunicatorConformance, ReduceScatterWithUnevenParts) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size();
    // 10 elements over 4 ranks: parts of 2, 3, 2, 3; 3 elements over 4: one part is empty.
    for (int64_t total : {int64_t{10}, int64_t{3}, int64_t{1000}}) {
      std::vector<float> send(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i) send[static_cast<size_t>(i)] = static_cast<float>(1000 * r + i);
      const int64_t begin = part_begin(total, r, n), end = part_begin(total, r + 1, n);
      Tensor in = b.make(send);
      Tensor out = b.make(end - begin);
      comm.reduce_scatter_async(in, out).wait();
      const std::vector<float> got = b.get(out);
      for (int64_t i = begin; i < end; ++i) {
        EXPECT_EQ(got[static_cast<size_t>(i - begin)], 1000.0f * n * (n - 1) / 2 + static_cast<float>(n * i))
            << "element " << i << " of " << total;
      }
      EXPECT_EQ(b.get(in), send) << "the input is unchanged";
    }
  });
}

TYPED_TEST_P(CommunicatorConformance, AllGatherWithUnevenParts) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size();
    for (int64_t total : {int64_t{10}, int64_t{3}, int64_t{1000}}) {
      std::vector<float> buffer(static_cast<size_t>(total), -1.0f);
      for (int64_t i = part_begin(total, r, n); i < part_begin(total, r + 1, n); ++i) {
        buffer[static_cast<size_t>(i)] = static_cast<float>(1000 * r + i);
      }
      Tensor t = b.make(buffer);
      comm.all_gather_async(t).wait();
      const std::vector<float> got = b.get(t);
      for (int64_t i = 0; i < total; ++i) {
        EXPECT_EQ(got[static_cast<size_t>(i)], static_cast<float>(1000 * owner_of(i, total, n) + i))
            << "element " << i << " of " << total;
      }
    }
  });
}

// A ring in which every rank posts its receive before its send, then several tagged
// messages of different sizes to the next rank, received in another order than sent.
TYPED_TEST_P(CommunicatorConformance, SendRecvPostedInAnyOrder) {
  this->for_each_size(2, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
    Tensor in = b.make(5), out = b.make(std::vector<float>(5, static_cast<float>(r)));
    CommRequest rx = comm.recv_async(in, prev, 7);
    CommRequest tx = comm.send_async(out, next, 7);
    rx.wait();
    tx.wait();
    EXPECT_EQ(b.get(in), std::vector<float>(5, static_cast<float>(prev)));

    const int tags[] = {3, 1, 2};
    const int64_t sizes[] = {3, 7000, 1};  // by tag - 1
    std::vector<Tensor> sent, received(3);
    std::vector<CommRequest> receives(3), sends;
    // Receives for tags 2, 3 (posted now) and 1 (posted after the sends).
    for (int tag : {2, 3}) {
      received[tag - 1] = b.make(sizes[tag - 1]);
      receives[tag - 1] = comm.recv_async(received[tag - 1], prev, tag);
    }
    for (int tag : tags) {
      std::vector<float> v(static_cast<size_t>(sizes[tag - 1]));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(10000 * tag + 100 * r + static_cast<int>(i % 97));
      sent.push_back(b.make(v));
      sends.push_back(comm.send_async(sent.back(), next, tag));
    }
    received[0] = b.make(sizes[0]);
    receives[0] = comm.recv_async(received[0], prev, 1);
    for (int k = 2; k >= 0; --k) receives[static_cast<size_t>(k)].wait();
    for (CommRequest& s : sends) s.wait();
    for (int tag = 1; tag <= 3; ++tag) {
      const std::vector<float> got = b.get(received[tag - 1]);
      ASSERT_EQ(static_cast<int64_t>(got.size()), sizes[tag - 1]);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], static_cast<float>(10000 * tag + 100 * prev + static_cast<int>(i % 97)))
            << "tag " << tag << " element " << i;
      }
    }
  });
}

// Every rank sends to and receives from both neighbours in one exchange (a ring
// step in both directions); with two ranks both neighbours are the same peer, told
// apart by tag.
TYPED_TEST_P(CommunicatorConformance, GroupedExchange) {
  this->for_each_size(2, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
    Tensor to_next = b.make(std::vector<float>(300, static_cast<float>(r)));
    Tensor to_prev = b.make(std::vector<float>(2, static_cast<float>(-r)));
    Tensor from_prev = b.make(300), from_next = b.make(2);
    const std::vector<Transfer> sends = {{to_next, next, 1}, {to_prev, prev, 2}};
    const std::vector<Transfer> receives = {{from_prev, prev, 1}, {from_next, next, 2}};
    for (int round = 0; round < 3; ++round) {  // the same buffers again: each round completes before the next
      b.set(to_next, std::vector<float>(300, static_cast<float>(r + 10 * round)));
      comm.exchange(sends, receives).wait();
      EXPECT_EQ(b.get(from_prev), std::vector<float>(300, static_cast<float>(prev + 10 * round))) << round;
      EXPECT_EQ(b.get(from_next), std::vector<float>(2, static_cast<float>(-next))) << round;
    }
    // Only some ranks take part: rank 0 sends to rank 1, which only receives.
    if (r <= 1) {
      Tensor t = b.make(std::vector<float>(4, 42.0f + r));
      const std::vector<Transfer> one = {{t, 1 - r, 5}};
      if (r == 0) {
        comm.exchange(one, {}).wait();
      } else {
        comm.exchange({}, one).wait();
        EXPECT_EQ(b.get(t), std::vector<float>(4, 42.0f));
      }
    }
    // Nothing to exchange is complete at once.
    EXPECT_FALSE(comm.exchange({}, {}).pending());
  });
}

// A ring attention step in bf16: bf16 key/value rows and fp32 gradients in one
// exchange, in both directions. A message reduces nothing, so both arrive bit for
// bit (bf16 values of every exponent, fp32 values that bf16 could not hold), and each
// counts the bytes of its own dtype (bf16: 2 a value).
TYPED_TEST_P(CommunicatorConformance, GroupedExchangeOfBf16AndFp32Messages) {
  this->for_each_size(2, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
    auto rows = [](int rank, int64_t count, float scale) {
      std::vector<float> v(static_cast<size_t>(count));
      for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (1.0f + 1e-3f * static_cast<float>(i) + 0.37f * rank);
      return v;
    };
    Tensor keys = b.make(rows(r, 513, 1e-20f), DType::BF16), gradients = b.make(rows(r, 65, 3.0f));
    Tensor keys_in = b.make(513, DType::BF16), gradients_in = b.make(65);
    comm.reset_stats();
    const std::vector<Transfer> sends = {{keys, next, 1}, {gradients, prev, 2}};
    const std::vector<Transfer> receives = {{keys_in, prev, 1}, {gradients_in, next, 2}};
    comm.exchange(sends, receives).wait();
    std::vector<float> want_keys = rows(prev, 513, 1e-20f);
    for (float& x : want_keys) x = round_bf16(x);
    EXPECT_EQ(b.get(keys_in), want_keys);
    EXPECT_EQ(b.get(gradients_in), rows(next, 65, 3.0f));
    EXPECT_NE(b.get(gradients_in)[1], round_bf16(b.get(gradients_in)[1]));  // fp32 bits bf16 cannot hold
    EXPECT_EQ(comm.stats().p2p_bytes, 513 * 2 + 65 * 4);
    EXPECT_EQ(comm.stats().p2p_messages, 2);
  });
}

// All-to-all with a size per peer (expert parallelism's dispatch and combine): rank
// r sends r + q + 1 elements to rank q (none to itself when r is even), each naming
// sender, receiver and index, so every misplaced element shows; counts that do not sum
// to the tensors are refused before anything moves.
TYPED_TEST_P(CommunicatorConformance, AllToAllWithASizePerPeer) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size();
    auto count = [](int from, int to) -> int64_t { return from == to && from % 2 == 0 ? 0 : from + to + 1; };
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<float> out;
    for (int q = 0; q < n; ++q) {
      send_counts.push_back(count(r, q));
      recv_counts.push_back(count(q, r));
      for (int64_t i = 0; i < count(r, q); ++i) out.push_back(static_cast<float>(1000 * r + 100 * q + i));
    }
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    Tensor send = b.make(out), recv = b.make(total);
    comm.all_to_all_v_async(send, send_counts, recv, recv_counts).wait();
    std::vector<float> expected;
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < count(q, r); ++i) expected.push_back(static_cast<float>(1000 * q + 100 * r + i));
    EXPECT_EQ(b.get(recv), expected);
    std::vector<int64_t> short_counts = send_counts;
    short_counts[0] += 1;
    EXPECT_THROW(comm.all_to_all_v_async(send, short_counts, recv, recv_counts), std::invalid_argument);
  });
}

TYPED_TEST_P(CommunicatorConformance, ZeroLengthMessagesAndCollectives) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size();
    Tensor empty = b.make(0);
    comm.all_reduce(empty, ReduceOp::Sum);
    comm.all_gather(empty);
    comm.reduce_scatter(empty, b.make(0));
    if (n > 1) {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      CommRequest rx = comm.recv_async(b.make(0), prev, 4);
      comm.send(b.make(0), next, 4);
      rx.wait();
      const std::vector<Transfer> sends = {{b.make(0), next, 6}}, receives = {{b.make(0), prev, 6}};
      comm.exchange(sends, receives).wait();
    }
    // The group still works afterwards.
    Tensor one = b.make(std::vector<float>{1.0f});
    comm.all_reduce(one, ReduceOp::Sum);
    EXPECT_EQ(b.get(one)[0], static_cast<float>(n));
  });
}

TYPED_TEST_P(CommunicatorConformance, HostValueAllReduce) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers&) {
    const int r = comm.rank(), n = comm.size();
    std::vector<double> d = {0.25 * r, -1.0 * r, 3.0};
    comm.all_reduce(std::span<double>(d), ReduceOp::Sum);
    EXPECT_EQ(d[0], 0.25 * n * (n - 1) / 2);
    EXPECT_EQ(d[1], -1.0 * n * (n - 1) / 2);
    EXPECT_EQ(d[2], 3.0 * n);
    // int64 sums beyond 2^53 stay exact (they do not pass through a double).
    const int64_t big = (int64_t{1} << 60) + 1;
    std::vector<int64_t> i = {big, r == n - 1 ? int64_t{5} : -int64_t{7}};
    comm.all_reduce(std::span<int64_t>(i), ReduceOp::Sum);
    EXPECT_EQ(i[0], big * n);
    EXPECT_EQ(i[1], 5 - 7 * (n - 1));
    std::vector<int64_t> m = {r == 0 ? big : int64_t{r}};
    comm.all_reduce(std::span<int64_t>(m), ReduceOp::Max);
    EXPECT_EQ(m[0], big);
    EXPECT_EQ(comm.all_reduce_sum(2.5), 2.5 * n);
  });
}

// A receive whose size differs from the message's is an error naming the group, the
// operation and the peer, longer and shorter alike; the group works afterwards.
TYPED_TEST_P(CommunicatorConformance, MismatchedReceiveIsAnError) {
  this->for_each_size(2, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank();
    for (int64_t receive_size : {int64_t{4}, int64_t{6}}) {
      SCOPED_TRACE("receive of " + std::to_string(receive_size) + " for a message of 5");
      if (r == 0) {
        comm.send(b.make(std::vector<float>(5, 1.0f)), 1, 9);
      } else if (r == 1) {
        CommRequest rx = comm.recv_async(b.make(receive_size), 0, 9);
        try {
          rx.wait();
          ADD_FAILURE() << "a receive of the wrong size completed";
        } catch (const std::exception& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find(comm.name()), std::string::npos) << what;
          EXPECT_NE(what.find("recv"), std::string::npos) << what;
          EXPECT_NE(what.find("rank"), std::string::npos) << what;
        }
      }
    }
    Tensor one = b.make(std::vector<float>{1.0f});
    comm.all_reduce(one, ReduceOp::Sum);
    EXPECT_EQ(b.get(one)[0], static_cast<float>(comm.size()));
  });
}

// A reduce-scatter whose receive is not this rank's part is refused before anything moves.
TYPED_TEST_P(CommunicatorConformance, ReduceScatterOfTheWrongPartSizeIsAnError) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int64_t part = part_begin(10, comm.rank() + 1, comm.size()) - part_begin(10, comm.rank(), comm.size());
    try {
      comm.reduce_scatter(b.make(10), b.make(part + 1));
      ADD_FAILURE() << "a reduce-scatter into the wrong part size ran";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(comm.name() + " reduce-scatter"), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(part + 1)), std::string::npos) << what;
    }
    Tensor one = b.make(std::vector<float>{1.0f});
    comm.all_reduce(one, ReduceOp::Sum);
    EXPECT_EQ(b.get(one)[0], static_cast<float>(comm.size()));
  });
}

// Collectives whose sizes differ across ranks: an error on every rank where the
// implementation can see the other ranks' sizes; MPI and NCCL cannot (the call is
// undefined there), which the skip says.
TYPED_TEST_P(CommunicatorConformance, MismatchedCollectiveSizesAreAnError) {
  if (!TypeParam::kDetectsMismatchedCollectives) {
    GTEST_SKIP() << "this implementation cannot see other ranks' sizes (MPI and NCCL leave it undefined)";
  }
  this->for_each_size(2, [](Communicator& comm, ConformanceBuffers& b) {
    Tensor t = b.make(3 + comm.rank());
    try {
      comm.all_reduce(t, ReduceOp::Sum);
      ADD_FAILURE() << "an all-reduce of different sizes ran";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(comm.name() + " all-reduce"), std::string::npos) << e.what();
    }
  });
}

// CommStats: collectives count the bytes a ring sends per rank (ring_collective_bytes),
// point-to-point the payload of each send (receives count nothing).
TYPED_TEST_P(CommunicatorConformance, StatsCountBytesAsARingSends) {
  this->for_each_size(1, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size();
    const int64_t elements = 1000, bytes = elements * 4;
    comm.reset_stats();
    Tensor t = b.make(elements);
    b.set(t, std::vector<float>(elements, 1.0f));
    comm.all_reduce(t, ReduceOp::Sum);
    EXPECT_EQ(comm.stats().collective_bytes, ring_collective_bytes(bytes, n, 2));
    EXPECT_EQ(comm.stats().collective_bytes, n == 1 ? 0 : 2 * bytes * (n - 1) / n);
    const int64_t part = part_begin(elements, r + 1, n) - part_begin(elements, r, n);
    comm.reduce_scatter(t, b.make(part));
    comm.all_gather(t);
    EXPECT_EQ(comm.stats().collectives, 3);
    EXPECT_EQ(comm.stats().collective_bytes, ring_collective_bytes(bytes, n, 2) + 2 * ring_collective_bytes(bytes, n, 1));
    EXPECT_EQ(comm.stats().p2p_bytes, 0);
    if (n > 1) {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      CommRequest rx = comm.recv_async(b.make(10), prev, 1);
      comm.send(b.make(std::vector<float>(10, 0.0f)), next, 1);
      rx.wait();
      const std::vector<Transfer> sends = {{b.make(std::vector<float>(20, 0.0f)), next, 2}};
      const std::vector<Transfer> receives = {{b.make(20), prev, 2}};
      comm.exchange(sends, receives).wait();
      EXPECT_EQ(comm.stats().p2p_bytes, 30 * 4);
      EXPECT_EQ(comm.stats().p2p_messages, 2);
    }
    comm.reset_stats();
    EXPECT_EQ(comm.stats().collective_bytes, 0);
    EXPECT_EQ(comm.stats().collectives, 0);
  });
}

// Messages of one peer and tag match in the order sent, receive k taking message k
// however the receives are waited for (what the pipeline's tags rely on, and MPI's
// non-overtaking rule): three messages of one tag and different sizes, their
// receives posted in order, one before the sends, and waited in reverse.
TYPED_TEST_P(CommunicatorConformance, MessagesOfOneTagMatchInTheOrderSent) {
  this->for_each_size(2, [](Communicator& comm, ConformanceBuffers& b) {
    const int r = comm.rank(), n = comm.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
    const int64_t sizes[] = {2, 3000, 1};
    std::vector<Tensor> received, sent;
    std::vector<CommRequest> receives, sends;
    auto value = [](int k, int rank, size_t i) {
      return static_cast<float>(10000 * k + 100 * rank + static_cast<int>(i % 97));
    };
    received.push_back(b.make(sizes[0]));
    receives.push_back(comm.recv_async(received.back(), prev, 5));
    for (int k = 0; k < 3; ++k) {
      std::vector<float> v(static_cast<size_t>(sizes[k]));
      for (size_t i = 0; i < v.size(); ++i) v[i] = value(k, r, i);
      sent.push_back(b.make(v));
      sends.push_back(comm.send_async(sent.back(), next, 5));
    }
    for (int k = 1; k < 3; ++k) {
      received.push_back(b.make(sizes[k]));
      receives.push_back(comm.recv_async(received.back(), prev, 5));
    }
    for (int k = 2; k >= 0; --k) receives[static_cast<size_t>(k)].wait();
    for (CommRequest& s : sends) s.wait();
    for (int k = 0; k < 3; ++k) {
      const std::vector<float> got = b.get(received[static_cast<size_t>(k)]);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], value(k, prev, i)) << "message " << k << " element " << i;
    }
  });
}

// Tags run from 0 to max_tag(), at least what every MPI allows; one outside is
// refused when the send or receive is made, naming the group and the tag.
TYPED_TEST_P(CommunicatorConformance, TagsOutsideZeroToTheLargestAreRefused) {
  this->for_each_size(2, [](Communicator& comm, ConformanceBuffers& b) {
    EXPECT_GE(comm.max_tag(), kGuaranteedMaxTag);
    const int peer = (comm.rank() + 1) % comm.size();
    Tensor t = b.make(std::vector<float>{1, 2});
    std::vector<int> bad = {-1};
    if (comm.max_tag() < INT_MAX) bad.push_back(comm.max_tag() + 1);
    for (int tag : bad) {
      for (const bool send : {true, false}) {
        try {
          CommRequest request = send ? comm.send_async(t, peer, tag) : comm.recv_async(t, peer, tag);
          ADD_FAILURE() << "tag " << tag << " accepted";
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find(comm.name() + (send ? " send to" : " recv from")), std::string::npos)
              << e.what();
          EXPECT_NE(std::string(e.what()).find("tag " + std::to_string(tag) + " is outside 0.." +
                                               std::to_string(comm.max_tag())),
                    std::string::npos) << e.what();
        }
      }
    }
  });
}

REGISTER_TYPED_TEST_SUITE_P(CommunicatorConformance, AllReduceSumAndMax, AllReduceOfBf16Tensors,
                            ReduceScatterWithUnevenParts, AllGatherWithUnevenParts, SendRecvPostedInAnyOrder,
                            GroupedExchange, GroupedExchangeOfBf16AndFp32Messages, AllToAllWithASizePerPeer, ZeroLengthMessagesAndCollectives, HostValueAllReduce,
                            MismatchedReceiveIsAnError, ReduceScatterOfTheWrongPartSizeIsAnError,
                            MismatchedCollectiveSizesAreAnError, StatsCountBytesAsARingSends,
                            MessagesOfOneTagMatchInTheOrderSent, TagsOutsideZeroToTheLargestAreRefused);

}  // namespace hdp::testing
