// Embedding lookup over a vocabulary slice, and its accumulating backward, against
// a naive double reference. The backward is the exact gradient of
// L = sum(out * G) with respect to the table (the op is linear), so the reference
// gradient is sum over tokens t with token v of G[t]. Tolerance: sums of a few
// float terms, 1e-6.

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "test_util.h"

namespace {
using hdp::testing::random_floats;
using hdp::IndexTensor;
using hdp::Tensor;

}  // namespace

TEST(KernelsEmbedding, ForwardFullTableAndSlice) {
  const int64_t V = 50, H = 37, T = 200;
  const auto table = random_floats(V * H, 1);
  std::vector<int32_t> tokens(T);
  std::mt19937 rng(2);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  std::vector<float> out(T * H, -1.0f);
  hdp::embedding_forward(Tensor(out.data(), {T, H}), IndexTensor(tokens.data(), {T}),
                         Tensor(const_cast<float*>(table.data()), {V, H}), 0);
  for (int64_t t = 0; t < T; ++t)
    ASSERT_EQ(0, std::memcmp(out.data() + t * H, table.data() + tokens[t] * H, H * sizeof(float))) << t;
  // Slice holding ids [20, 35): rows 20..34 of the full table.
  const int64_t begin = 20, VL = 15;
  std::vector<float> out2(T * H, -1.0f);
  hdp::embedding_forward(Tensor(out2.data(), {T, H}), IndexTensor(tokens.data(), {T}),
                         Tensor(const_cast<float*>(table.data()) + begin * H, {VL, H}), begin);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c) {
      const bool held = tokens[t] >= begin && tokens[t] < begin + VL;
      ASSERT_EQ(out2[t * H + c], held ? table[tokens[t] * H + c] : 0.0f) << t << " " << c;
    }
}

TEST(KernelsEmbedding, BackwardAccumulatesRowsAndSlicesSumToFull) {
  const int64_t V = 40, H = 300, T = 500;  // T * H large enough for the threaded path
  const auto g = random_floats(T * H, 3), d0 = random_floats(V * H, 4);
  std::vector<int32_t> tokens(T);
  std::mt19937 rng(5);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);  // many repeats
  std::vector<double> ref(d0.begin(), d0.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c) ref[tokens[t] * H + c] += g[t * H + c];

  std::vector<float> d = d0;
  hdp::embedding_backward(Tensor(d.data(), {V, H}), IndexTensor(tokens.data(), {T}),
                          Tensor(const_cast<float*>(g.data()), {T, H}), 0);
  for (size_t i = 0; i < d.size(); ++i) ASSERT_NEAR(d[i], ref[i], 1e-5) << i;

  // Two slices [0, 17) and [17, 40) accumulate exactly the full table's gradient.
  std::vector<float> s = d0;
  hdp::embedding_backward(Tensor(s.data(), {17, H}), IndexTensor(tokens.data(), {T}),
                          Tensor(const_cast<float*>(g.data()), {T, H}), 0);
  hdp::embedding_backward(Tensor(s.data() + 17 * H, {V - 17, H}), IndexTensor(tokens.data(), {T}),
                          Tensor(const_cast<float*>(g.data()), {T, H}), 17);
  EXPECT_EQ(0, std::memcmp(s.data(), d.data(), d.size() * sizeof(float)));

  // Same bits with one thread.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> d1 = d0;
  hdp::embedding_backward(Tensor(d1.data(), {V, H}), IndexTensor(tokens.data(), {T}),
                          Tensor(const_cast<float*>(g.data()), {T, H}), 0);
  omp_set_num_threads(threads);
  EXPECT_EQ(0, std::memcmp(d1.data(), d.data(), d.size() * sizeof(float)));
}

TEST(KernelsEmbedding, ShapeChecks) {
  std::vector<float> buf(1000);
  std::vector<int32_t> tok(10, 0);
  EXPECT_THROW(hdp::embedding_forward(Tensor(buf.data(), {10, 8}), IndexTensor(tok.data(), {10}),
                                      Tensor(buf.data(), {5, 7}), 0),
               std::invalid_argument);
  EXPECT_THROW(hdp::embedding_backward(Tensor(buf.data(), {5, 8}), IndexTensor(tok.data(), {9}),
                                       Tensor(buf.data(), {10, 8}), 0),
               std::invalid_argument);
}
