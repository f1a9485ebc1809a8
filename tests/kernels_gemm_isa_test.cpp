// oneDNN's GEMM on older instruction sets than this CPU's: each case caps oneDNN
// (dnnl_set_max_cpu_isa, as ONEDNN_MAX_CPU_ISA would) before its first product,
// so an AVX-512 machine runs the kernels an AVX2-only or SSE4.1-only CPU would
// get, and checks them against a naive loop. The cap is process-wide and only
// takes before oneDNN's first use: ctest runs each case in its own process; a
// later case in the same process is skipped.

#include <dnnl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace {

void check_capped(dnnl_cpu_isa_t cap, const std::vector<std::string>& allowed) {
  if (dnnl_set_max_cpu_isa(cap) != dnnl_success) GTEST_SKIP() << "oneDNN already in use in this process";
  const std::string isa = hdp::cpu::onednn_sgemm_isa();
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), isa), allowed.end()) << isa;
  const int64_t M = 150, N = 90, K = 70;
  const auto a = hdp::testing::random_floats(M * K, 21), b = hdp::testing::random_floats(N * K, 22);
  std::vector<float> c(M * N);
  hdp::linear_forward(hdp::Tensor(c.data(), {M, N}), hdp::Tensor(const_cast<float*>(a.data()), {M, K}),
                      hdp::Tensor(const_cast<float*>(b.data()), {N, K}));
  double worst = 0, scale = 1;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(a[i * K + k]) * b[j * K + k];
      scale = std::max(scale, std::fabs(s));
      worst = std::max(worst, std::fabs(s - c[i * N + j]));
    }
  EXPECT_LE(worst, 1e-5 * scale) << isa;
}

}  // namespace

TEST(KernelsGemmIsa, Avx2OnlyCpu) { check_capped(dnnl_cpu_isa_avx2, {"avx2", "avx", "sse41", "reference"}); }

TEST(KernelsGemmIsa, Sse41OnlyCpu) { check_capped(dnnl_cpu_isa_sse41, {"sse41", "reference"}); }
