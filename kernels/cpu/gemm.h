#pragma once
// The CPU backend's dense products. matmul and linear_* (cpu_ops.h) run on oneDNN's
// sgemm (Debian's libdnnl), which picks its kernels at run time from the CPU's
// feature bits (AVX-512, AVX2, AVX, SSE4.1), never from a table of CPU models, so a
// CPU newer than the library still gets its widest kernels. OpenBLAS stays linked
// as the second library: GEMM peak measurement (kernels/peak_flops.h), benchmarks.
// Why oneDNN: docs/performance.md, "CPU GEMM library".
//
// Threads: the process has one pool, OpenMP's (libgomp; Debian builds oneDNN with
// its OpenMP runtime). A large product is split into row (or column) blocks of C,
// one per OpenMP thread, and each block runs single-threaded in the library.
// The split depends only on the shape and the thread count, and each library's
// single-threaded kernels are deterministic, so results are bit-identical for a
// given thread count, CPU and library.

#include <cstdint>
#include <string>

namespace hdp::cpu {

enum class GemmLibrary { onednn, openblas };

// The library matmul and linear_* run on.
constexpr GemmLibrary kGemmLibrary = GemmLibrary::onednn;

// C[M, N] = alpha op(A) op(B) + beta C, all row-major, split over the OpenMP
// threads as matmul does. beta = 0 ignores C (NaNs included).
void sgemm(GemmLibrary library, bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// What runs a product, for logs: e.g. "oneDNN 2.6.3 sgemm, avx512_core kernels",
// "OpenBLAS 0.3.21 sgemm, Haswell kernels".
std::string gemm_library_description(GemmLibrary library);
const char* gemm_library_name(GemmLibrary library);  // "oneDNN", "OpenBLAS"

// The instruction-set family of oneDNN's sgemm kernels on this CPU (after any
// ONEDNN_MAX_CPU_ISA cap): "avx512_core", "avx2", "avx", "sse41" or "reference".
const char* onednn_sgemm_isa();

}  // namespace hdp::cpu
