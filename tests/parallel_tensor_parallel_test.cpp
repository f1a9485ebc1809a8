// Tensor parallelism's regions and vocabulary-parallel cross-entropy
// (parallel/tensor_parallel.h) over an in-process group of threads: each region's
// forward and backward on hand-checked values, the f/g pair around a LLaMA MLP
// split over ranks against the unsplit MLP, sequence parallelism's all-gather and
// reduce-scatter regions on hand-checked values, and the split cross-entropy against
// the single-shard one.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "parallel/tensor_parallel.h"
#include "test_util.h"
#include "thread_communicator.h"

namespace hdp {
namespace {

using testing::random_floats;
using testing::run_ranks;
using testing::ThreadCommunicator;

Tensor host(std::vector<float>& v, std::initializer_list<int64_t> shape) { return Tensor(v.data(), shape, Device::CPU); }

// Columns [begin, end) of a row-major [rows, cols] matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t begin, int64_t end) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), m.begin() + r * cols + begin, m.begin() + r * cols + end);
  return out;
}

// Rows [begin, end) of a row-major matrix with `cols` columns.
std::vector<float> rows(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t end) {
  return std::vector<float>(m.begin() + begin * cols, m.begin() + end * cols);
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance) << what << " element " << i;
}

// The test group's all-to-all (tests/thread_communicator.h), which unit tests of
// expert dispatch run on: 3 ranks, rank r sends r + q elements to rank q.
TEST(ThreadCommunicator, AllToAllDeliversEachRanksPartsInRankOrder) {
  run_ranks(3, [](ThreadCommunicator& comm) {
    const int r = comm.rank();
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<float> send, expected;
    for (int q = 0; q < 3; ++q) {
      send_counts.push_back(r + q);
      recv_counts.push_back(q + r);
      for (int i = 0; i < r + q; ++i) send.push_back(static_cast<float>(100 * r + 10 * q + i));
      for (int i = 0; i < q + r; ++i) expected.push_back(static_cast<float>(100 * q + 10 * r + i));
    }
    std::vector<float> out(expected.size(), -1.0f);
    comm.all_to_all_v(host(send, {static_cast<int64_t>(send.size())}), send_counts,
                      host(out, {static_cast<int64_t>(out.size())}), recv_counts);
    EXPECT_EQ(out, expected) << "rank " << r;
  });
}

// ---- the regions --------------------------------------------------------------------

TEST(CopyToTensorParallelRegion, ForwardIsTheIdentityAndBackwardSumsTheRanksGradients) {
  run_ranks(3, [](ThreadCommunicator& tp) {
    const CopyToTensorParallelRegion f(&tp);
    const float r = static_cast<float>(tp.rank());
    std::vector<float> input = {1.5f, -2.0f, 4.0f};
    const Tensor x = host(input, {3});
    const Tensor through = f.forward(x);
    EXPECT_EQ(through.data, x.data);
    EXPECT_EQ(through.numel(), 3);
    EXPECT_EQ(tp.stats().collectives, 0);
    EXPECT_EQ(input, (std::vector<float>{1.5f, -2.0f, 4.0f}));

    // Rank r's partial gradient: (r + 1, 10 r, -r); the sum over ranks 0, 1, 2 is (6, 30, -3).
    std::vector<float> grad = {r + 1, 10 * r, -r};
    f.backward(host(grad, {3}));
    EXPECT_EQ(grad, (std::vector<float>{6.0f, 30.0f, -3.0f}));
    EXPECT_EQ(tp.stats().collectives, 1);
  });
}

TEST(ReduceFromTensorParallelRegion, ForwardSumsTheRanksOutputsAndBackwardIsTheIdentity) {
  run_ranks(4, [](ThreadCommunicator& tp) {
    const ReduceFromTensorParallelRegion g(&tp);
    const float r = static_cast<float>(tp.rank());
    // Rank r's partial output [[r, 1], [2 r, -1]]; the sum over ranks 0..3 is [[6, 4], [12, -4]].
    std::vector<float> output = {r, 1.0f, 2 * r, -1.0f};
    g.forward(host(output, {2, 2}));
    EXPECT_EQ(output, (std::vector<float>{6.0f, 4.0f, 12.0f, -4.0f}));
    EXPECT_EQ(tp.stats().collectives, 1);

    std::vector<float> grad = {0.25f, r, -3.0f, 8.0f};
    const Tensor dy = host(grad, {2, 2});
    const Tensor through = g.backward(dy);
    EXPECT_EQ(through.data, dy.data);
    EXPECT_EQ(through.dim(0), 2);
    EXPECT_EQ(through.dim(1), 2);
    EXPECT_EQ(grad, (std::vector<float>{0.25f, r, -3.0f, 8.0f}));
    EXPECT_EQ(tp.stats().collectives, 1);
  });
}

// With one rank, or no communicator, all four sides leave the values alone and
// make no collective.
TEST(TensorParallelRegions, WithOneRankOrNoCommunicatorEverySideIsTheIdentity) {
  run_ranks(1, [](ThreadCommunicator& tp) {
    for (Communicator* comm : {static_cast<Communicator*>(&tp), static_cast<Communicator*>(nullptr)}) {
      std::vector<float> v = {3.0f, -1.0f};
      const CopyToTensorParallelRegion f(comm);
      const ReduceFromTensorParallelRegion g(comm);
      EXPECT_EQ(f.forward(host(v, {2})).data, v.data());
      f.backward(host(v, {2}));
      g.forward(host(v, {2}));
      EXPECT_EQ(g.backward(host(v, {2})).data, v.data());
      EXPECT_EQ(v, (std::vector<float>{3.0f, -1.0f}));
    }
    EXPECT_EQ(tp.stats().collectives, 0);
  });
}

// ---- sequence parallelism's regions ---------------------------------------------------

TEST(GatherFromSequenceParallelRegion, ForwardGathersTheShardsAndBackwardReduceScattersTheGradients) {
  run_ranks(3, [](ThreadCommunicator& tp) {
    const GatherFromSequenceParallelRegion gather(&tp);
    const float r = static_cast<float>(tp.rank());
    // Rank r's shard [2, 2]: [[r, 10 r], [r + 1, -r]].
    std::vector<float> shard = {r, 10 * r, r + 1, -r}, whole(12, -7.0f);
    const Tensor gathered = gather.forward(host(shard, {2, 2}), host(whole, {6, 2}));
    EXPECT_EQ(gathered.data, whole.data());
    EXPECT_EQ(whole, (std::vector<float>{0, 0, 1, 0, 1, 10, 2, -1, 2, 20, 3, -2}));
    EXPECT_EQ(tp.stats().collectives, 1);

    // Rank r's partial gradient of the whole sequence: row i holds (i + r, i r). Rank q
    // receives the sum over r = 0, 1, 2 of rows 2q and 2q + 1: (3 i + 3, 3 i).
    std::vector<float> grad;
    for (int i = 0; i < 6; ++i) grad.insert(grad.end(), {i + r, i * r});
    std::vector<float> shard_grad(4, -7.0f);
    gather.backward(host(grad, {6, 2}), host(shard_grad, {2, 2}));
    const float i0 = static_cast<float>(2 * tp.rank());
    EXPECT_EQ(shard_grad, (std::vector<float>{3 * i0 + 3, 3 * i0, 3 * i0 + 6, 3 * i0 + 3}));
    EXPECT_EQ(tp.stats().collectives, 2);
  });
}

TEST(ReduceScatterToSequenceParallelRegion, ForwardReduceScattersTheOutputsAndBackwardGathersTheGradients) {
  run_ranks(2, [](ThreadCommunicator& tp) {
    const ReduceScatterToSequenceParallelRegion scatter(&tp);
    const float r = static_cast<float>(tp.rank());
    // Rank r's partial output [4, 1]: (r, 2 r, 3 + r, -r); the sum over ranks 0, 1 is
    // (1, 2, 7, -1): rank 0 keeps rows 0 and 1, rank 1 rows 2 and 3.
    std::vector<float> partial = {r, 2 * r, 3 + r, -r}, shard(2, -7.0f);
    scatter.forward(host(partial, {4, 1}), host(shard, {2, 1}));
    EXPECT_EQ(shard, tp.rank() == 0 ? (std::vector<float>{1, 2}) : (std::vector<float>{7, -1}));
    EXPECT_EQ(tp.stats().collectives, 1);

    std::vector<float> shard_grad = {r + 0.5f, -r}, whole(4, -7.0f);
    const Tensor gathered = scatter.backward(host(shard_grad, {2, 1}), host(whole, {4, 1}));
    EXPECT_EQ(gathered.data, whole.data());
    EXPECT_EQ(whole, (std::vector<float>{0.5f, 0, 1.5f, -1}));
    EXPECT_EQ(tp.stats().collectives, 2);
  });
}

// One rank, or no communicator: the shard is the whole sequence, and each side copies.
TEST(SequenceParallelRegions, WithOneRankOrNoCommunicatorEverySideCopies) {
  run_ranks(1, [](ThreadCommunicator& tp) {
    for (Communicator* comm : {static_cast<Communicator*>(&tp), static_cast<Communicator*>(nullptr)}) {
      const GatherFromSequenceParallelRegion gather(comm);
      const ReduceScatterToSequenceParallelRegion scatter(comm);
      std::vector<float> a = {3.0f, -1.0f}, b(2, 0.0f), c(2, 0.0f), d(2, 0.0f), e(2, 0.0f);
      gather.forward(host(a, {2, 1}), host(b, {2, 1}));
      gather.backward(host(b, {2, 1}), host(c, {2, 1}));
      scatter.forward(host(c, {2, 1}), host(d, {2, 1}));
      scatter.backward(host(d, {2, 1}), host(e, {2, 1}));
      EXPECT_EQ(e, a);
    }
    EXPECT_EQ(tp.stats().collectives, 0);
  });
}

// A whole sequence of the wrong number of rows for the shards is refused.
TEST(GatherFromSequenceParallelRegion, RefusesAWholeOfAnotherSizeThanTheShards) {
  run_ranks(2, [](ThreadCommunicator& tp) {
    std::vector<float> shard(4), whole(6);
    EXPECT_THROW(GatherFromSequenceParallelRegion(&tp).forward(host(shard, {2, 2}), host(whole, {3, 2})),
                 std::invalid_argument);
  });
}

// Megatron's MLP split: gate and up column-parallel behind f, down row-parallel in
// front of g. Output, input gradient and every weight gradient slice equal the
// unsplit MLP's.
TEST(TensorParallelRegions, AroundASplitMlpGiveTheUnsplitOutputAndGradients) {
  const int64_t T = 5, H = 8, F = 12;
  const int ranks = 3;
  std::vector<float> x = random_floats(T * H, 1), gate_w = random_floats(F * H, 2), up_w = random_floats(F * H, 3),
                     down_w = random_floats(H * F, 4), dy = random_floats(T * H, 5);
  // The unsplit MLP, forward and backward.
  std::vector<float> gate(T * F), up(T * F), act(T * F), y(T * H), dact(T * F), dgate(T * F), dup(T * F), dx(T * H),
      d_gate_w(F * H), d_up_w(F * H), d_down_w(H * F);
  linear_forward(host(gate, {T, F}), host(x, {T, H}), host(gate_w, {F, H}));
  linear_forward(host(up, {T, F}), host(x, {T, H}), host(up_w, {F, H}));
  swiglu_forward(host(act, {T, F}), host(gate, {T, F}), host(up, {T, F}));
  linear_forward(host(y, {T, H}), host(act, {T, F}), host(down_w, {H, F}));
  linear_backward(host(dact, {T, F}), host(d_down_w, {H, F}), host(dy, {T, H}), host(act, {T, F}), host(down_w, {H, F}),
                  false);
  swiglu_backward(host(dgate, {T, F}), host(dup, {T, F}), host(dact, {T, F}), host(gate, {T, F}), host(up, {T, F}));
  linear_backward(host(dx, {T, H}), host(d_gate_w, {F, H}), host(dgate, {T, F}), host(x, {T, H}), host(gate_w, {F, H}),
                  false);
  linear_backward(host(dx, {T, H}), host(d_up_w, {F, H}), host(dup, {T, F}), host(x, {T, H}), host(up_w, {F, H}), true);

  run_ranks(ranks, [&](ThreadCommunicator& tp) {
    const CopyToTensorParallelRegion mlp_input(&tp);
    const ReduceFromTensorParallelRegion mlp_output(&tp);
    const int64_t b = part_begin(F, tp.rank(), ranks), e = part_begin(F, tp.rank() + 1, ranks), f = e - b;
    std::vector<float> my_x = x, my_dy = dy, g_w = rows(gate_w, H, b, e), u_w = rows(up_w, H, b, e),
                       d_w = columns(down_w, H, F, b, e);
    std::vector<float> g(T * f), u(T * f), a(T * f), out(T * H), da(T * f), dg(T * f), du(T * f), dxr(T * H),
        dg_w(f * H), du_w(f * H), dd_w(H * f);

    const Tensor in = mlp_input.forward(host(my_x, {T, H}));
    linear_forward(host(g, {T, f}), in, host(g_w, {f, H}));
    linear_forward(host(u, {T, f}), in, host(u_w, {f, H}));
    swiglu_forward(host(a, {T, f}), host(g, {T, f}), host(u, {T, f}));
    linear_forward(host(out, {T, H}), host(a, {T, f}), host(d_w, {H, f}));
    mlp_output.forward(host(out, {T, H}));

    const Tensor dout = mlp_output.backward(host(my_dy, {T, H}));
    linear_backward(host(da, {T, f}), host(dd_w, {H, f}), dout, host(a, {T, f}), host(d_w, {H, f}), false);
    swiglu_backward(host(dg, {T, f}), host(du, {T, f}), host(da, {T, f}), host(g, {T, f}), host(u, {T, f}));
    linear_backward(host(dxr, {T, H}), host(dg_w, {f, H}), host(dg, {T, f}), in, host(g_w, {f, H}), false);
    linear_backward(host(dxr, {T, H}), host(du_w, {f, H}), host(du, {T, f}), in, host(u_w, {f, H}), true);
    mlp_input.backward(host(dxr, {T, H}));

    EXPECT_EQ(tp.stats().collectives, 2);  // g forward and f backward
    expect_near(out, y, 1e-5f, "output");
    expect_near(dxr, dx, 1e-5f, "input gradient");
    expect_near(dg_w, rows(d_gate_w, H, b, e), 1e-5f, "gate weight gradient");
    expect_near(du_w, rows(d_up_w, H, b, e), 1e-5f, "up weight gradient");
    expect_near(dd_w, columns(d_down_w, H, F, b, e), 1e-5f, "down weight gradient");
  });
}

// ---- vocabulary-parallel cross-entropy ----------------------------------------------

// Rows predict targets in every slice, one row predicts nothing.
struct CrossEntropyCase {
  static constexpr int64_t n = 6, V = 10;
  std::vector<float> logits = random_floats(n * V, 7, -4.0f, 4.0f);
  std::vector<int32_t> targets = {0, 9, 4, -1, 6, 3};
  static constexpr float scale = 0.5f;
};

TEST(VocabParallelCrossEntropy, SplitOverRanksEqualsTheWholeVocabulary) {
  const CrossEntropyCase c;
  const int64_t n = c.n, V = c.V;
  const int ranks = 3;  // slices of 3, 3 and 4 ids
  std::vector<float> grad = c.logits, scratch(3 * n);
  std::vector<int32_t> targets = c.targets;
  const double loss = cross_entropy_forward_backward(host(grad, {n, V}), IndexTensor(targets.data(), {n}), c.scale,
                                                     host(scratch, {3 * n}));
  run_ranks(ranks, [&](ThreadCommunicator& tp) {
    const int64_t b = part_begin(V, tp.rank(), ranks), e = part_begin(V, tp.rank() + 1, ranks);
    std::vector<float> slice = columns(c.logits, n, V, b, e), stats(3 * n), global_max(n);
    std::vector<int32_t> my_targets = c.targets;
    double my_loss = 0;
    vocab_parallel_cross_entropy(&tp, host(slice, {n, e - b}), IndexTensor(my_targets.data(), {n}), b, c.scale,
                                 host(stats, {3 * n}), host(global_max, {n}), DoubleTensor(&my_loss, {1}));
    EXPECT_NEAR(my_loss, loss, 1e-5 * loss);
    expect_near(slice, columns(grad, n, V, b, e), 1e-6f, "logit gradient");
    EXPECT_EQ(tp.stats().collectives, 2);  // the row max, then the sums of exponentials and target logits
  });
}

TEST(VocabParallelCrossEntropy, OneRankIsTheSingleShardCrossEntropyBitForBit) {
  const CrossEntropyCase c;
  const int64_t n = c.n, V = c.V;
  std::vector<float> grad = c.logits, scratch(3 * n);
  std::vector<int32_t> targets = c.targets;
  const double loss = cross_entropy_forward_backward(host(grad, {n, V}), IndexTensor(targets.data(), {n}), c.scale,
                                                     host(scratch, {3 * n}));
  EXPECT_GT(loss, 0.0);
  run_ranks(1, [&](ThreadCommunicator& tp) {
    std::vector<float> logits = c.logits, stats(3 * n);
    double one_rank_loss = 0;
    vocab_parallel_cross_entropy(&tp, host(logits, {n, V}), IndexTensor(targets.data(), {n}), 0, c.scale,
                                 host(stats, {3 * n}), Tensor(), DoubleTensor(&one_rank_loss, {1}));
    EXPECT_EQ(one_rank_loss, loss);
    EXPECT_EQ(logits, grad);
    EXPECT_EQ(tp.stats().collectives, 0);
  });
}

}  // namespace
}  // namespace hdp
