// The MoE block's row movement (gather_rows, combine_rows,
// combine_rows_weight_backward): each op against a naive reference, gather and
// combine as adjoints of each other for a top-k routing, the weight gradient
// against finite differences, the bf16 twins against the fp32 ops, empty tensors,
// the errors (an index out of range, wrong dtypes and shapes), and the guarded
// device against the CPU.
//
// Exact comparisons: a gather copies or multiplies once; the combine is specified
// as an fp32 sum in j order from 0 with each product rounded (kernels/ops.h), which
// the reference repeats (its products pass through a volatile, so the compiler
// cannot fuse them into FMAs the kernel does not use); the weight gradient is a
// double dot product in h order rounded once, which the reference repeats too.

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace {

using hdp::testing::thrown_message;

using hdp::Arena;
using hdp::bf16;
using hdp::Device;
using hdp::DType;
using hdp::IndexTensor;
using hdp::Tensor;
using hdp::testing::random_floats;
using hdp::to_bf16;
using hdp::to_float;

Tensor as_tensor(std::vector<float>& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), dims); }
IndexTensor as_index(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return IndexTensor(v.data(), dims);
}

std::vector<int32_t> random_indices(size_t n, int32_t limit, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, limit - 1);
  std::vector<int32_t> v(n);
  for (int32_t& e : v) e = u(rng);
  return v;
}

// A top-k routing of T tokens over `experts` experts (k distinct experts per token):
// `dispatch` [T * k] lists the token of each (t, j) pair in expert order, and
// `slot` [T, k] where pair (t, j) landed in that order (the inverse permutation).
struct Routing {
  std::vector<int32_t> dispatch, slot;
};
Routing route(int64_t T, int64_t k, int32_t experts, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> choice(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(experts));
    for (int32_t e = 0; e < experts; ++e) all[static_cast<size_t>(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < k; ++j) choice[static_cast<size_t>(t * k + j)] = all[static_cast<size_t>(j)];
  }
  Routing r;
  r.slot.resize(choice.size());
  for (int32_t e = 0; e < experts; ++e)
    for (size_t p = 0; p < choice.size(); ++p)
      if (choice[p] == e) {
        r.slot[p] = static_cast<int32_t>(r.dispatch.size());
        r.dispatch.push_back(static_cast<int32_t>(p / static_cast<size_t>(k)));
      }
  return r;
}

// out[t] = sum_j w[t, j] * rows[index[t, j]] in fp32, j order, each product rounded.
std::vector<float> reference_combine(const std::vector<float>& rows, const std::vector<int32_t>& index,
                                     const std::vector<float>* weights, int64_t T, int64_t k, int64_t H) {
  std::vector<float> out(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const float v = rows[static_cast<size_t>(index[static_cast<size_t>(t * k + j)] * H + h)];
        volatile float product = weights ? (*weights)[static_cast<size_t>(t * k + j)] * v : v;
        acc = acc + product;
      }
      out[static_cast<size_t>(t * H + h)] = acc;
    }
  return out;
}

// dweights[t, j] = <dout[t], rows[index[t, j]]> in double, h order, rounded once.
std::vector<float> reference_weight_gradient(const std::vector<float>& dout, const std::vector<float>& rows,
                                             const std::vector<int32_t>& index, int64_t T, int64_t k, int64_t H) {
  std::vector<float> dw(static_cast<size_t>(T * k));
  for (int64_t p = 0; p < T * k; ++p) {
    double dot = 0;
    for (int64_t h = 0; h < H; ++h)
      dot += static_cast<double>(dout[static_cast<size_t>((p / k) * H + h)]) *
             rows[static_cast<size_t>(index[static_cast<size_t>(p)] * H + h)];
    dw[static_cast<size_t>(p)] = static_cast<float>(dot);
  }
  return dw;
}


TEST(KernelsMoeRows, GatherCopiesOrScalesTheIndexedRows) {
  const int64_t T = 37, H = 72, N = 50;  // repeats: 50 rows drawn from 37
  auto x = random_floats(T * H, 1);
  auto index = random_indices(N, T, 2);
  auto scale = random_floats(N, 3, -2, 2);
  std::vector<float> out(N * H, 9.0f), scaled(N * H, 9.0f);
  hdp::gather_rows(as_tensor(out, {N, H}), as_tensor(x, {T, H}), as_index(index, {N}));
  hdp::gather_rows(as_tensor(scaled, {N, H}), as_tensor(x, {T, H}), as_index(index, {N}), as_tensor(scale, {N}));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const float v = x[static_cast<size_t>(index[static_cast<size_t>(r)] * H + h)];
      ASSERT_EQ(out[static_cast<size_t>(r * H + h)], v) << r << ", " << h;
      ASSERT_EQ(scaled[static_cast<size_t>(r * H + h)], scale[static_cast<size_t>(r)] * v) << r << ", " << h;
    }
}

TEST(KernelsMoeRows, CombineSumsTheWeightedRowsInOrder) {
  for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{3}}) {
    const int64_t T = 37, H = 72, N = 45;
    auto rows = random_floats(N * H, 4);
    auto index = random_indices(T * k, N, 5);  // rows may repeat, within and across tokens
    auto weights = random_floats(T * k, 6, 0, 1);
    std::vector<float> out(T * H, 9.0f), plain(T * H, 9.0f);  // overwritten, not accumulated
    hdp::combine_rows(as_tensor(out, {T, H}), as_tensor(rows, {N, H}), as_index(index, {T, k}),
                      as_tensor(weights, {T, k}));
    hdp::combine_rows(as_tensor(plain, {T, H}), as_tensor(rows, {N, H}), as_index(index, {T, k}));
    EXPECT_EQ(out, reference_combine(rows, index, &weights, T, k, H)) << "k=" << k;
    EXPECT_EQ(plain, reference_combine(rows, index, nullptr, T, k, H)) << "k=" << k;
  }
}

TEST(KernelsMoeRows, WeightGradientIsTheDoubleDotProduct) {
  const int64_t T = 37, k = 2, H = 72, N = 74;
  auto rows = random_floats(N * H, 7), dout = random_floats(T * H, 8);
  auto index = random_indices(T * k, N, 9);
  std::vector<float> dw(T * k, 9.0f);
  hdp::combine_rows_weight_backward(as_tensor(dw, {T, k}), as_tensor(dout, {T, H}), as_tensor(rows, {N, H}),
                                    as_index(index, {T, k}));
  EXPECT_EQ(dw, reference_weight_gradient(dout, rows, index, T, k, H));
}

// L(w) = sum(combine(rows, index, w) * G); dL/dw[t, j] by central differences. L is
// linear in w, so the differences are exact but for the fp32 rounding of the
// combine's output: with h = 0.25 that is ~1e-6 of the gradient.
TEST(KernelsMoeRows, WeightGradientMatchesFiniteDifferences) {
  const int64_t T = 11, k = 2, H = 72, N = 22;
  auto rows = random_floats(N * H, 10), G = random_floats(T * H, 11);
  const Routing routing = route(T, k, 4, 12);
  auto slot = routing.slot;
  auto w = random_floats(T * k, 13, 0, 1);
  std::vector<float> dw(T * k);
  hdp::combine_rows_weight_backward(as_tensor(dw, {T, k}), as_tensor(G, {T, H}), as_tensor(rows, {N, H}),
                                    as_index(slot, {T, k}));
  const auto loss = [&](std::vector<float>& weights) {
    std::vector<float> out(T * H);
    hdp::combine_rows(as_tensor(out, {T, H}), as_tensor(rows, {N, H}), as_index(slot, {T, k}),
                      as_tensor(weights, {T, k}));
    double L = 0;
    for (size_t i = 0; i < out.size(); ++i) L += static_cast<double>(out[i]) * G[i];
    return L;
  };
  const float h = 0.25f;
  for (int64_t p = 0; p < T * k; ++p) {
    auto plus = w, minus = w;
    plus[static_cast<size_t>(p)] += h;
    minus[static_cast<size_t>(p)] -= h;
    const double fd = (loss(plus) - loss(minus)) / (static_cast<double>(plus[static_cast<size_t>(p)]) -
                                                     minus[static_cast<size_t>(p)]);
    EXPECT_NEAR(dw[static_cast<size_t>(p)], fd, 1e-5 * std::max(1.0, std::fabs(fd))) << "pair " << p;
  }
}

// For a routing where each token appears k times: <gather(x), y> = <x, combine(y)>
// with combine's index the inverse of gather's (slot), and with a scale per gathered
// row the combine's weights at the same pairs. Inner products in double; the
// combine's fp32 sums of k terms leave ~1e-7 relative.
TEST(KernelsMoeRows, GatherAndCombineAreAdjoint) {
  const int64_t T = 37, k = 2, H = 72, N = T * k;
  const Routing routing = route(T, k, 4, 14);
  auto dispatch = routing.dispatch, slot = routing.slot;
  auto x = random_floats(T * H, 15), y = random_floats(N * H, 16), w = random_floats(T * k, 17, 0, 1);
  std::vector<float> scale(N);
  for (int64_t p = 0; p < T * k; ++p) scale[static_cast<size_t>(slot[static_cast<size_t>(p)])] = w[static_cast<size_t>(p)];
  for (bool weighted : {false, true}) {
    std::vector<float> gx(N * H), cy(T * H);
    if (weighted) {
      hdp::gather_rows(as_tensor(gx, {N, H}), as_tensor(x, {T, H}), as_index(dispatch, {N}), as_tensor(scale, {N}));
      hdp::combine_rows(as_tensor(cy, {T, H}), as_tensor(y, {N, H}), as_index(slot, {T, k}), as_tensor(w, {T, k}));
    } else {
      hdp::gather_rows(as_tensor(gx, {N, H}), as_tensor(x, {T, H}), as_index(dispatch, {N}));
      hdp::combine_rows(as_tensor(cy, {T, H}), as_tensor(y, {N, H}), as_index(slot, {T, k}));
    }
    double lhs = 0, rhs = 0, magnitude = 0;
    for (size_t i = 0; i < gx.size(); ++i) {
      lhs += static_cast<double>(gx[i]) * y[i];
      magnitude += std::fabs(static_cast<double>(gx[i]) * y[i]);
    }
    for (size_t i = 0; i < cy.size(); ++i) rhs += static_cast<double>(x[i]) * cy[i];
    EXPECT_NEAR(lhs, rhs, 1e-6 * magnitude) << (weighted ? "weighted" : "plain");
    EXPECT_GT(std::fabs(lhs), 1.0);  // a real sum, not two zeros
  }
}

// The combine and the weight gradient give the same bits on one thread as on all.
TEST(KernelsMoeRows, DeterministicForAnyThreadCount) {
  const int64_t T = 300, k = 2, H = 72, N = 600;  // large enough to run in parallel
  auto rows = random_floats(N * H, 18), dout = random_floats(T * H, 19), w = random_floats(T * k, 20);
  auto index = random_indices(T * k, N, 21);
  const auto run = [&] {
    std::vector<float> out(T * H), dw(T * k);
    hdp::combine_rows(as_tensor(out, {T, H}), as_tensor(rows, {N, H}), as_index(index, {T, k}), as_tensor(w, {T, k}));
    hdp::combine_rows_weight_backward(as_tensor(dw, {T, k}), as_tensor(dout, {T, H}), as_tensor(rows, {N, H}),
                                      as_index(index, {T, k}));
    out.insert(out.end(), dw.begin(), dw.end());
    return out;
  };
  const std::vector<float> all = run();
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run();
  omp_set_num_threads(threads);
  EXPECT_EQ(all, one);
}

// ---- bf16: the twins equal the fp32 op on bf16-rounded inputs, rounded once --------

// Values rounded to bf16, held as fp32 (for the fp32 op) and as bf16 (for the twin).
struct Pair {
  std::vector<float> f;
  std::vector<bf16> b;
  Tensor F, B;
};
Pair make(std::initializer_list<int64_t> dims, uint32_t seed) {
  Pair p;
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  p.f = random_floats(static_cast<size_t>(n), seed);
  p.b.resize(p.f.size());
  for (size_t i = 0; i < p.f.size(); ++i) {
    p.b[i] = to_bf16(p.f[i]);
    p.f[i] = to_float(p.b[i]);
  }
  p.F = Tensor(p.f.data(), dims);
  p.B = Tensor::of_bf16(p.b.data(), dims);
  return p;
}
void expect_rounded(const Pair& p, const char* what) {
  for (size_t i = 0; i < p.f.size(); ++i) ASSERT_EQ(p.b[i].bits, to_bf16(p.f[i]).bits) << what << " at " << i;
}

TEST(KernelsMoeRows, Bf16TwinsRoundTheFp32OpsOnce) {
  const int64_t T = 37, k = 2, H = 72, N = T * k;
  const Routing routing = route(T, k, 4, 22);
  auto dispatch = routing.dispatch, slot = routing.slot;
  auto scale = random_floats(N, 23, -2, 2), w = random_floats(T * k, 24, 0, 1);
  Pair x = make({T, H}, 25), rows = make({N, H}, 26), scaled = make({N, H}, 27), out = make({T, H}, 28),
       plain = make({T, H}, 29), dout = make({T, H}, 30);

  hdp::gather_rows(rows.F, x.F, as_index(dispatch, {N}));
  hdp::gather_rows(rows.B, x.B, as_index(dispatch, {N}));
  expect_rounded(rows, "gather_rows");
  hdp::gather_rows(scaled.F, x.F, as_index(dispatch, {N}), as_tensor(scale, {N}));
  hdp::gather_rows(scaled.B, x.B, as_index(dispatch, {N}), as_tensor(scale, {N}));
  expect_rounded(scaled, "gather_rows (scale)");

  // rows' fp32 and bf16 halves hold equal values (a gather rounds nothing).
  hdp::combine_rows(out.F, rows.F, as_index(slot, {T, k}), as_tensor(w, {T, k}));
  hdp::combine_rows(out.B, rows.B, as_index(slot, {T, k}), as_tensor(w, {T, k}));
  expect_rounded(out, "combine_rows");
  hdp::combine_rows(plain.F, rows.F, as_index(slot, {T, k}));
  hdp::combine_rows(plain.B, rows.B, as_index(slot, {T, k}));
  expect_rounded(plain, "combine_rows (no weights)");

  std::vector<float> dw_f(T * k), dw_b(T * k);
  hdp::combine_rows_weight_backward(as_tensor(dw_f, {T, k}), dout.F, rows.F, as_index(slot, {T, k}));
  hdp::combine_rows_weight_backward(as_tensor(dw_b, {T, k}), dout.B, rows.B, as_index(slot, {T, k}));
  EXPECT_EQ(dw_f, dw_b);
}

// ---- empty tensors and errors -----------------------------------------------------

TEST(KernelsMoeRows, EmptyTensorsWork) {
  const int64_t H = 8;
  std::vector<float> x = random_floats(5 * H, 31), none;
  std::vector<int32_t> no_index;
  // No rows gathered, from rows or from none.
  EXPECT_NO_THROW(hdp::gather_rows(as_tensor(none, {0, H}), as_tensor(x, {5, H}), as_index(no_index, {0})));
  EXPECT_NO_THROW(hdp::gather_rows(as_tensor(none, {0, H}), as_tensor(none, {0, H}), as_index(no_index, {0}),
                                   as_tensor(none, {0})));
  // No token: nothing to combine, no weight to differentiate.
  EXPECT_NO_THROW(hdp::combine_rows(as_tensor(none, {0, H}), as_tensor(none, {0, H}), as_index(no_index, {0, 2}),
                                    as_tensor(none, {0, 2})));
  EXPECT_NO_THROW(hdp::combine_rows_weight_backward(as_tensor(none, {0, 2}), as_tensor(none, {0, H}),
                                                    as_tensor(none, {0, H}), as_index(no_index, {0, 2})));
  // Tokens that chose no expert (k = 0): zero rows, overwritten.
  std::vector<float> out(3 * H, 9.0f);
  hdp::combine_rows(as_tensor(out, {3, H}), as_tensor(none, {0, H}), as_index(no_index, {3, 0}));
  EXPECT_EQ(out, std::vector<float>(3 * H, 0.0f));
  // Rows of width 0: every weight gradient is an empty dot product, 0.
  std::vector<int32_t> index = {0, 1, 1, 0};
  std::vector<float> dw(4, 9.0f);
  hdp::combine_rows_weight_backward(as_tensor(dw, {2, 2}), as_tensor(none, {2, 0}), as_tensor(none, {2, 0}),
                                    as_index(index, {2, 2}));
  EXPECT_EQ(dw, std::vector<float>(4, 0.0f));
}

TEST(KernelsMoeRows, AnIndexOutOfRangeIsRefusedNamingTheOpAndTheRow) {
  const int64_t T = 5, H = 4;
  std::vector<float> x = random_floats(T * H, 32), out(4 * H, 9.0f), dw(4, 9.0f), g = random_floats(2 * H, 33);
  for (int32_t bad : {-1, static_cast<int32_t>(T)}) {
    std::vector<int32_t> index = {0, 4, 2, 3};
    index[2] = bad;
    std::string e = thrown_message([&] { hdp::gather_rows(as_tensor(out, {4, H}), as_tensor(x, {T, H}), as_index(index, {4})); });
    EXPECT_NE(e.find("gather_rows"), std::string::npos) << e;
    EXPECT_NE(e.find("index[2] = " + std::to_string(bad)), std::string::npos) << e;
    EXPECT_NE(e.find("x=[5, 4]"), std::string::npos) << e;
    EXPECT_EQ(out, std::vector<float>(4 * H, 9.0f)) << "checked before anything is written";

    // index [2, 2]: entry 2 is token 1's choice 0.
    e = thrown_message([&] { hdp::combine_rows(as_tensor(g, {2, H}), as_tensor(x, {T, H}), as_index(index, {2, 2})); });
    EXPECT_NE(e.find("combine_rows"), std::string::npos) << e;
    EXPECT_NE(e.find("index[1, 0] = " + std::to_string(bad)), std::string::npos) << e;
    e = thrown_message([&] {
      hdp::combine_rows_weight_backward(as_tensor(dw, {2, 2}), as_tensor(g, {2, H}), as_tensor(x, {T, H}),
                                        as_index(index, {2, 2}));
    });
    EXPECT_NE(e.find("combine_rows_weight_backward"), std::string::npos) << e;
    EXPECT_NE(e.find("index[1, 0] = " + std::to_string(bad)), std::string::npos) << e;
  }
}

TEST(KernelsMoeRows, WrongDtypesAndShapesAreRefusedNamingTheOp) {
  const int64_t T = 4, k = 2, H = 8, N = T * k;
  Pair x = make({T, H}, 34), rows = make({N, H}, 35), out = make({T, H}, 36), gathered = make({N, H}, 37);
  Pair scale = make({N}, 38), w = make({T, k}, 39);
  std::vector<int32_t> index = random_indices(N, static_cast<int32_t>(T), 40), slot = random_indices(N, N, 41);
  const IndexTensor I = as_index(index, {N}), S = as_index(slot, {T, k});

  std::string e = thrown_message([&] { hdp::gather_rows(gathered.B, x.F, I); });
  EXPECT_NE(e.find("gather_rows: unsupported dtypes out=bf16, x=fp32"), std::string::npos) << e;
  e = thrown_message([&] { hdp::gather_rows(gathered.B, x.B, I, scale.B); });
  EXPECT_NE(e.find("gather_rows"), std::string::npos) << e;
  EXPECT_NE(e.find("scale=bf16"), std::string::npos) << e;
  e = thrown_message([&] { hdp::combine_rows(out.B, rows.B, S, w.B); });
  EXPECT_NE(e.find("combine_rows"), std::string::npos) << e;
  EXPECT_NE(e.find("weights=bf16"), std::string::npos) << e;
  e = thrown_message([&] { hdp::combine_rows(out.F, rows.B, S); });
  EXPECT_NE(e.find("combine_rows: unsupported dtypes out=fp32, rows=bf16"), std::string::npos) << e;
  e = thrown_message([&] { hdp::combine_rows_weight_backward(w.B, out.B, rows.B, S); });
  EXPECT_NE(e.find("combine_rows_weight_backward"), std::string::npos) << e;
  EXPECT_NE(e.find("dweights=bf16"), std::string::npos) << e;

  e = thrown_message([&] { hdp::gather_rows(gathered.F, x.F, I, scale.F.view({2, 4})); });
  EXPECT_NE(e.find("gather_rows: scale=[2, 4] must have shape [8]"), std::string::npos) << e;
  e = thrown_message([&] { hdp::gather_rows(out.F, x.F, I); });
  EXPECT_NE(e.find("gather_rows: out=[4, 8] must have shape [8, 8]"), std::string::npos) << e;
  e = thrown_message([&] { hdp::combine_rows(out.F, rows.F, S.view({N})); });
  EXPECT_NE(e.find("combine_rows: index=[8] must have shape [*, *]"), std::string::npos) << e;
  e = thrown_message([&] { hdp::combine_rows(out.F, rows.F, S, w.F.view({k, T})); });
  EXPECT_NE(e.find("combine_rows: weights=[2, 4] must have shape [4, 2]"), std::string::npos) << e;
  e = thrown_message([&] { hdp::combine_rows_weight_backward(w.F, rows.F, rows.F, S); });
  EXPECT_NE(e.find("combine_rows_weight_backward: dout=[8, 8] must have shape [4, 8]"), std::string::npos) << e;
}

// ---- the guarded device (the CPU kernels behind a device boundary) ------------------

// A host vector on the guarded device and back.
Tensor to_device(Arena& arena, const std::vector<float>& v, std::initializer_list<int64_t> dims, DType dtype) {
  const Tensor t = arena.tensor(dims, dtype);
  hdp::copy(t, Tensor(const_cast<float*>(v.data()), dims));  // fp32 -> bf16 rounds
  return t;
}
IndexTensor to_device(Arena& arena, std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  const IndexTensor t = arena.index_tensor(dims);
  hdp::copy(t, IndexTensor(v.data(), dims));
  return t;
}
std::vector<float> to_host(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  hdp::copy(Tensor(out.data(), {t.numel()}), t.view({t.numel()}));
  return out;
}

TEST(KernelsMoeRows, TheGuardedDeviceEqualsTheCpu) {
  const int64_t T = 37, k = 2, H = 72, N = T * k;
  const Routing routing = route(T, k, 4, 42);
  auto dispatch = routing.dispatch, slot = routing.slot;
  const auto x = random_floats(T * H, 43), dout = random_floats(T * H, 44), scale = random_floats(N, 45, -2, 2),
             w = random_floats(T * k, 46, 0, 1);
  for (DType dt : {DType::F32, DType::BF16}) {
    Arena arena(Device::Guarded, 1 << 20, "moe rows");
    const IndexTensor dispatch_d = to_device(arena, dispatch, {N}), slot_d = to_device(arena, slot, {T, k});
    const Tensor x_d = to_device(arena, x, {T, H}, dt), dout_d = to_device(arena, dout, {T, H}, dt),
                 scale_d = to_device(arena, scale, {N}, DType::F32), w_d = to_device(arena, w, {T, k}, DType::F32);
    const Tensor rows_d = arena.tensor({N, H}, dt), scaled_d = arena.tensor({N, H}, dt),
                 out_d = arena.tensor({T, H}, dt), dw_d = arena.tensor({T, k});
    hdp::gather_rows(rows_d, x_d, dispatch_d);
    hdp::gather_rows(scaled_d, x_d, dispatch_d, scale_d);
    hdp::combine_rows(out_d, scaled_d, slot_d, w_d);
    hdp::combine_rows_weight_backward(dw_d, dout_d, rows_d, slot_d);

    // The same on the CPU, from the same (for bf16: rounded) values.
    Arena host(Device::CPU, 1 << 20, "moe rows host");
    const auto on_host = [&](const std::vector<float>& v, std::initializer_list<int64_t> dims, DType type) {
      return to_device(host, v, dims, type);
    };
    const Tensor x_h = on_host(x, {T, H}, dt), dout_h = on_host(dout, {T, H}, dt), scale_h = on_host(scale, {N}, DType::F32),
                 w_h = on_host(w, {T, k}, DType::F32);
    const Tensor rows_h = host.tensor({N, H}, dt), scaled_h = host.tensor({N, H}, dt), out_h = host.tensor({T, H}, dt),
                 dw_h = host.tensor({T, k});
    hdp::gather_rows(rows_h, x_h, as_index(dispatch, {N}));
    hdp::gather_rows(scaled_h, x_h, as_index(dispatch, {N}), scale_h);
    hdp::combine_rows(out_h, scaled_h, as_index(slot, {T, k}), w_h);
    hdp::combine_rows_weight_backward(dw_h, dout_h, rows_h, as_index(slot, {T, k}));

    const char* name = dt == DType::BF16 ? "bf16" : "fp32";
    EXPECT_EQ(to_host(rows_d), to_host(rows_h)) << name;
    EXPECT_EQ(to_host(scaled_d), to_host(scaled_h)) << name;
    EXPECT_EQ(to_host(out_d), to_host(out_h)) << name;
    EXPECT_EQ(to_host(dw_d), to_host(dw_h)) << name;

    // A bad index is caught there too, inside the device's access window.
    slot[3] = static_cast<int32_t>(N);
    const IndexTensor bad = to_device(arena, slot, {T, k});
    slot[3] = routing.slot[3];
    const std::string e = thrown_message([&] { hdp::combine_rows(out_d, rows_d, bad, w_d); });
    EXPECT_NE(e.find("combine_rows: index[1, 1] = 74 is not a row of rows=[74, 72]"), std::string::npos) << e;
  }
}

}  // namespace
