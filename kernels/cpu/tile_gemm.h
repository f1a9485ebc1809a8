#pragma once
// Small single-threaded GEMM on cache-resident tiles, used by the attention
// kernels (and benchmarked against single-threaded cblas_sgemm in
// bench/kernels_bench.cpp: with this machine's OpenBLAS core (Haswell, AVX2) the
// AVX-512 micro-kernel here is ~1.5x faster on 64..128-sized tiles).
//
//   C[M x N] = (accumulate ? C : 0) + A * B
//
// Element (m, k) of A is A[m * sam + k * sak], so A may be row-major (sam = lda,
// sak = 1) or a transposed view (sam = 1, sak = lda) without packing. B is
// row-major [K x N] with leading dimension ldb, C row-major with ldc.
// N must be a multiple of simd::kW: rows of B and C are read and written in whole
// vectors, so pad with zero columns when the logical width is smaller.
// Deterministic: every C element is a fixed-order sum over k (fused multiply-adds).

#include <cstdint>

namespace hdp::cpu {

void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t ldb,
               float* C, int64_t ldc, bool accumulate);

// Lanes per SIMD vector of the build (16 for AVX-512, 8 for AVX2, 4 otherwise).
int simd_width();
const char* simd_isa_name();

}  // namespace hdp::cpu
