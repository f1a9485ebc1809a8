// matmul / linear_forward / linear_backward (oneDNN), the OpenBLAS path and the
// attention tile micro-kernel against naive double loops, including transposes,
// alpha/beta and the accumulate flags; determinism; OpenBLAS thread scope.
//
// Tolerance: float products summed over K <= 100 terms of magnitude <= 1 carry an
// error of a few 1e-7 relative to the result scale; we allow 1e-5 of max(1, max|ref|).

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace {
using hdp::testing::random_floats;

using hdp::Tensor;


void expect_close(const std::vector<float>& got, const std::vector<double>& ref, double tol, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  double scale = 1;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]));
  EXPECT_LE(worst, tol * scale) << what;
}

// op(x)[i][j] of a row-major [rows, cols] matrix
double at(const std::vector<float>& x, int64_t cols, bool transpose, int64_t i, int64_t j) {
  return transpose ? x[j * cols + i] : x[i * cols + j];
}

}  // namespace

TEST(KernelsGemm, MatmulAllTransposesAlphaBeta) {
  const int64_t M = 37, N = 53, K = 29;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      const auto a = random_floats(M * K, 1), b = random_floats(K * N, 2), c0 = random_floats(M * N, 3);
      const int64_t acols = ta ? M : K, bcols = tb ? K : N;
      Tensor ta_t(const_cast<float*>(a.data()), {ta ? K : M, acols});
      Tensor tb_t(const_cast<float*>(b.data()), {tb ? N : K, bcols});
      for (float beta : {0.0f, 1.0f, -0.5f}) {
        std::vector<float> c = c0;
        if (beta == 0.0f) std::fill(c.begin(), c.end(), std::nanf(""));  // beta = 0 must ignore C
        hdp::matmul(Tensor(c.data(), {M, N}), ta_t, ta, tb_t, tb, 0.75f, beta);
        std::vector<double> ref(M * N);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += at(a, acols, ta, i, k) * at(b, bcols, tb, k, j);
            ref[i * N + j] = 0.75 * s + (beta == 0.0f ? 0.0 : beta * c0[i * N + j]);
          }
        expect_close(c, ref, 1e-5, "matmul");
      }
    }
}

TEST(KernelsGemm, MatmulRejectsMismatchedShapes) {
  std::vector<float> buf(1000);
  Tensor a(buf.data(), {4, 5}), b(buf.data(), {6, 3}), c(buf.data(), {4, 3});
  EXPECT_THROW(hdp::matmul(c, a, false, b, false), std::invalid_argument);
  try {
    hdp::matmul(c, a, false, b, false);
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos);
    EXPECT_NE(msg.find("[4, 5]"), std::string::npos);
    EXPECT_NE(msg.find("[6, 3]"), std::string::npos);
  }
  EXPECT_NO_THROW(hdp::matmul(c, a, false, Tensor(buf.data(), {3, 5}), true));
  EXPECT_THROW(hdp::matmul(c, a, false, Tensor(buf.data(), {3, 5}, hdp::Device::CUDA), true), std::invalid_argument);
}

TEST(KernelsGemm, LinearForwardAndBackward) {
  const int64_t T = 45, in = 33, out = 21;
  const auto x = random_floats(T * in, 4), w = random_floats(out * in, 5), dy = random_floats(T * out, 6);
  std::vector<float> y(T * out);
  hdp::linear_forward(Tensor(y.data(), {T, out}), Tensor(const_cast<float*>(x.data()), {T, in}),
                      Tensor(const_cast<float*>(w.data()), {out, in}));
  std::vector<double> yref(T * out), dxref(T * in, 0.0), dwref(out * in, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * w[o * in + i];
      yref[t * out + o] = s;
    }
  expect_close(y, yref, 1e-5, "linear_forward y");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        dxref[t * in + i] += double(dy[t * out + o]) * w[o * in + i];
        dwref[o * in + i] += double(dy[t * out + o]) * x[t * in + i];
      }
  const auto dx0 = random_floats(T * in, 7), dw0 = random_floats(out * in, 8);
  for (bool acc : {false, true}) {
    std::vector<float> dx = dx0, dw = dw0;
    hdp::linear_backward(Tensor(dx.data(), {T, in}), Tensor(dw.data(), {out, in}),
                         Tensor(const_cast<float*>(dy.data()), {T, out}), Tensor(const_cast<float*>(x.data()), {T, in}),
                         Tensor(const_cast<float*>(w.data()), {out, in}), acc);
    std::vector<double> dxe = dxref, dwe = dwref;
    for (size_t i = 0; i < dxe.size(); ++i) dxe[i] += acc ? dx0[i] : 0.0;
    for (size_t i = 0; i < dwe.size(); ++i) dwe[i] += dw0[i];  // dw always accumulates
    expect_close(dx, dxe, 1e-5, acc ? "dx accumulated" : "dx overwritten");
    expect_close(dw, dwe, 1e-5, "dw");
  }
  // An empty dx skips the input gradient.
  std::vector<float> dw = dw0;
  hdp::linear_backward(Tensor(), Tensor(dw.data(), {out, in}), Tensor(const_cast<float*>(dy.data()), {T, out}),
                       Tensor(const_cast<float*>(x.data()), {T, in}), Tensor(const_cast<float*>(w.data()), {out, in}),
                       false);
  std::vector<double> dwe = dwref;
  for (size_t i = 0; i < dwe.size(); ++i) dwe[i] += dw0[i];
  expect_close(dw, dwe, 1e-5, "dw without dx");
  // An empty dw skips the weight gradient: x is not read (here it holds NaNs), and dx
  // equals what the full call gives, bit for bit.
  {
    std::vector<float> dx_alone = dx0, dx_full = dx0, dw_full = dw0;
    const std::vector<float> unread(x.size(), std::numeric_limits<float>::quiet_NaN());
    hdp::linear_backward(Tensor(dx_alone.data(), {T, in}), Tensor(), Tensor(const_cast<float*>(dy.data()), {T, out}),
                         Tensor(const_cast<float*>(unread.data()), {T, in}),
                         Tensor(const_cast<float*>(w.data()), {out, in}), true);
    hdp::linear_backward(Tensor(dx_full.data(), {T, in}), Tensor(dw_full.data(), {out, in}),
                         Tensor(const_cast<float*>(dy.data()), {T, out}), Tensor(const_cast<float*>(x.data()), {T, in}),
                         Tensor(const_cast<float*>(w.data()), {out, in}), true);
    EXPECT_EQ(dx_alone, dx_full);
    EXPECT_THROW(hdp::linear_backward(Tensor(), Tensor(), Tensor(const_cast<float*>(dy.data()), {T, out}),
                                      Tensor(const_cast<float*>(x.data()), {T, in}),
                                      Tensor(const_cast<float*>(w.data()), {out, in}), false),
                 std::invalid_argument);
  }
  EXPECT_THROW(hdp::linear_forward(Tensor(y.data(), {T, out}), Tensor(const_cast<float*>(x.data()), {T, in}),
                                   Tensor(const_cast<float*>(w.data()), {out, in + 1})),
               std::invalid_argument);
}

TEST(KernelsGemm, TileGemmAgainstNaiveWithStridesAndAccumulate) {
  const int W = hdp::cpu::simd_width();
  for (int64_t M : {1, 5, 6, 7, 13, 64})
    for (int64_t N : {int64_t(W), int64_t(2 * W), int64_t(5 * W), int64_t(64)})
      for (int64_t K : {1, 3, 64})
        for (bool transposed_a : {false, true})
          for (bool acc : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K << " tA=" << transposed_a
                                              << " acc=" << acc);
            const int64_t lda = transposed_a ? M + 3 : K + 2, ldb = N + W, ldc = N + 2 * W;
            const auto a = random_floats((transposed_a ? K : M) * lda, 11), b = random_floats(K * ldb, 12);
            std::vector<float> c = random_floats(M * ldc, 13);
            const std::vector<float> c0 = c;
            const int64_t sam = transposed_a ? 1 : lda, sak = transposed_a ? lda : 1;
            hdp::cpu::tile_gemm(M, N, K, a.data(), sam, sak, b.data(), ldb, c.data(), ldc, acc);
            std::vector<float> got;
            std::vector<double> ref;
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                got.push_back(c[i * ldc + j]);
                if (j >= N) {
                  ref.push_back(c0[i * ldc + j]);  // beyond N: untouched
                  continue;
                }
                double s = acc ? c0[i * ldc + j] : 0.0;
                for (int64_t k = 0; k < K; ++k) s += double(a[i * sam + k * sak]) * b[k * ldb + j];
                ref.push_back(s);
              }
            expect_close(got, ref, 1e-6, "tile_gemm");
          }
}

TEST(KernelsGemm, BothLibrariesAgainstNaiveAndDeterministic) {
  // Large enough to be split over the OpenMP threads (kParallelMinWork), in rows
  // (M >= N) and in columns (M < N), with every transpose pair and beta.
  for (auto [M, N, K] : {std::array<int64_t, 3>{160, 70, 97}, std::array<int64_t, 3>{50, 300, 80}})
    for (hdp::cpu::GemmLibrary library : {hdp::cpu::GemmLibrary::onednn, hdp::cpu::GemmLibrary::openblas})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          SCOPED_TRACE(::testing::Message() << hdp::cpu::gemm_library_name(library) << " M=" << M << " N=" << N
                                            << " ta=" << ta << " tb=" << tb);
          const auto a = random_floats(M * K, 11), b = random_floats(K * N, 12), c0 = random_floats(M * N, 13);
          const int64_t acols = ta ? M : K, bcols = tb ? K : N;
          std::vector<double> ref(M * N);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double s = 0;
              for (int64_t k = 0; k < K; ++k) s += at(a, acols, ta, i, k) * at(b, bcols, tb, k, j);
              ref[i * N + j] = -1.5 * s + 0.5 * c0[i * N + j];
            }
          std::vector<float> c1 = c0, c2 = c0;
          hdp::cpu::sgemm(library, ta, tb, M, N, K, -1.5f, a.data(), acols, b.data(), bcols, 0.5f, c1.data(), N);
          hdp::cpu::sgemm(library, ta, tb, M, N, K, -1.5f, a.data(), acols, b.data(), bcols, 0.5f, c2.data(), N);
          expect_close(c1, ref, 1e-5, hdp::cpu::gemm_library_name(library));
          EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float))) << "not bit-identical";
        }
}

TEST(KernelsGemm, EmptyInnerDimensionScalesC) {
  for (hdp::cpu::GemmLibrary library : {hdp::cpu::GemmLibrary::onednn, hdp::cpu::GemmLibrary::openblas}) {
    std::vector<float> c = {1.0f, -2.0f, 3.0f, std::nanf("")};
    hdp::cpu::sgemm(library, false, false, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 2, 0.0f, c.data(), 2);
    EXPECT_EQ(c, std::vector<float>(4, 0.0f));
    c = {1.0f, -2.0f, 3.0f, 4.0f};
    hdp::cpu::sgemm(library, true, true, 2, 2, 0, 1.0f, nullptr, 2, nullptr, 0, 2.0f, c.data(), 2);
    EXPECT_EQ(c, (std::vector<float>{2.0f, -4.0f, 6.0f, 8.0f}));
  }
}

TEST(KernelsGemm, DescribesLibraryAndInstructionSet) {
  // The trainer logs these; the ISA is oneDNN's choice for this CPU (or the
  // ONEDNN_MAX_CPU_ISA cap), never a guess from a CPU model table.
  const std::string isa = hdp::cpu::onednn_sgemm_isa();
  const std::vector<std::string> known = {"avx512_core", "avx512_mic", "avx2", "avx", "sse41", "reference"};
  EXPECT_NE(std::find(known.begin(), known.end(), isa), known.end()) << isa;
  const std::string onednn = hdp::cpu::gemm_library_description(hdp::cpu::GemmLibrary::onednn);
  EXPECT_EQ(onednn.rfind("oneDNN ", 0), 0u) << onednn;
  EXPECT_NE(onednn.find(isa + " kernels"), std::string::npos) << onednn;
  const std::string openblas = hdp::cpu::gemm_library_description(hdp::cpu::GemmLibrary::openblas);
  EXPECT_EQ(openblas.rfind("OpenBLAS", 0), 0u) << openblas;
  EXPECT_NE(openblas.find(hdp::cpu::blas_core_name()), std::string::npos) << openblas;
  EXPECT_EQ(hdp::cpu::kGemmLibrary, hdp::cpu::GemmLibrary::onednn);
}

TEST(KernelsGemm, OpenBlasIsKeptSingleThreaded) {
  // The backend splits products over OpenMP itself; a multi-threaded OpenBLAS
  // inside those blocks would oversubscribe the cores.
  hdp::cpu::set_blas_num_threads(2);
  std::vector<float> a(256 * 256, 1.0f), b(256 * 256, 1.0f), c(256 * 256);
  hdp::cpu::sgemm(hdp::cpu::GemmLibrary::openblas, false, false, 256, 256, 256, 1.0f, a.data(), 256, b.data(), 256,
                  0.0f, c.data(), 256);
  EXPECT_EQ(c[0], 256.0f);
  EXPECT_EQ(hdp::cpu::blas_num_threads(), 1);
  EXPECT_NE(hdp::cpu::blas_core_name(), nullptr);
}
