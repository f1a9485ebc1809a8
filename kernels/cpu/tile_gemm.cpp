#include "kernels/cpu/tile_gemm.h"

#include <array>
#include <utility>

#include "kernels/cpu/simd.h"

namespace hdp::cpu {
namespace {

using namespace simd;

// Register blocking: kMR rows of C times kNV vectors. With 32 zmm registers
// (AVX-512) 6 x 4 accumulators + 4 B vectors + 1 broadcast fit; 16 ymm (AVX2)
// take 4 x 3 + 3 + 1.
#if defined(__AVX512F__)
constexpr int kMR = 6, kNV = 4;
#elif defined(__AVX2__)
constexpr int kMR = 4, kNV = 3;
#else
constexpr int kMR = 4, kNV = 2;
#endif

template <int MR, int NV>
void micro_kernel(int64_t K, const float* __restrict A, int64_t sam, int64_t sak, const float* __restrict B,
                  int64_t ldb, float* __restrict C, int64_t ldc, bool accumulate) {
  vf c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) c[r][j] = accumulate ? load(C + r * ldc + j * kW) : zero();
  for (int64_t k = 0; k < K; ++k) {
    vf b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) b[j] = load(B + k * ldb + j * kW);
    const float* a = A + k * sak;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vf ar = set1(a[r * sam]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) c[r][j] = fmadd(ar, b[j], c[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) store(C + r * ldc + j * kW, c[r][j]);
}

using KernelFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, bool);

template <int MR, int... NVs>
constexpr auto kernel_row(std::integer_sequence<int, NVs...>) {
  return std::array<KernelFn, sizeof...(NVs)>{&micro_kernel<MR, NVs + 1>...};
}
template <int... MRs>
constexpr auto kernel_table(std::integer_sequence<int, MRs...>) {
  return std::array<std::array<KernelFn, kNV>, sizeof...(MRs)>{
      kernel_row<MRs + 1>(std::make_integer_sequence<int, kNV>{})...};
}
constexpr auto kKernels = kernel_table(std::make_integer_sequence<int, kMR>{});

}  // namespace

void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t ldb,
               float* C, int64_t ldc, bool accumulate) {
  for (int64_t n0 = 0; n0 < N; n0 += kNV * kW) {
    const int64_t nv = (N - n0) / kW < kNV ? (N - n0) / kW : kNV;
    if (nv == 0) break;  // N not a multiple of kW: the caller broke the contract; leave the tail alone
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int64_t mr = M - m0 < kMR ? M - m0 : kMR;
      kKernels[mr - 1][nv - 1](K, A + m0 * sam, sam, sak, B + n0, ldb, C + m0 * ldc + n0, ldc, accumulate);
    }
  }
}

int simd_width() { return kW; }
const char* simd_isa_name() { return isa_name(); }

}  // namespace hdp::cpu
