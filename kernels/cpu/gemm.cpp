// Dense products: oneDNN's sgemm (or OpenBLAS's cblas_sgemm, for comparison),
// split over the OpenMP threads. The process runs one thread pool, OpenMP's:
// OpenBLAS is kept at one thread, and oneDNN (built on the same libgomp) runs
// single-threaded inside an OpenMP parallel region. Two pools that each spin
// after their work would steal the cores from one another between the GEMMs and
// the other kernels of a layer. See gemm.h.

#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/cpu_ops.h"

extern "C" char* openblas_get_config(void);

namespace hdp::cpu {
namespace {

// The build compiles every kernel for the build machine (-march=native) or for
// x86-64-v3 (AVX2 + FMA, HDP_NATIVE=OFF). On a CPU without those instructions the
// first vector kernel would die of SIGILL somewhere; refuse at start-up instead,
// naming what is missing. Compiled for baseline x86-64 so the check itself runs.
#if defined(__x86_64__)
__attribute__((constructor, target("arch=x86-64"))) void refuse_cpu_without_build_isa() {
  __builtin_cpu_init();
  char missing[128] = "";  // no std::string: its out-of-line code is compiled for the build's ISA
#if defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f")) std::strcat(missing, " avx512f");
#endif
#if defined(__AVX512BW__)
  if (!__builtin_cpu_supports("avx512bw")) std::strcat(missing, " avx512bw");
#endif
#if defined(__AVX512VL__)
  if (!__builtin_cpu_supports("avx512vl")) std::strcat(missing, " avx512vl");
#endif
#if defined(__AVX512DQ__)
  if (!__builtin_cpu_supports("avx512dq")) std::strcat(missing, " avx512dq");
#endif
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2")) std::strcat(missing, " avx2");
#endif
#if defined(__FMA__)
  if (!__builtin_cpu_supports("fma")) std::strcat(missing, " fma");
#endif
#if defined(__AVX__)
  if (!__builtin_cpu_supports("avx")) std::strcat(missing, " avx");
#endif
  if (missing[0] != '\0') {
    std::fprintf(stderr,
                 "hdp-trainer: this CPU lacks instructions the build was compiled for:%s. It was built with "
                 "-march=native on another machine; rebuild here, or configure with -DHDP_NATIVE=OFF (AVX2 + FMA, "
                 "x86-64-v3) for a portable binary.\n",
                 missing);
    std::_Exit(1);
  }
}
#endif

int to_blas_int(int64_t v, const char* op) {
  if (v > INT_MAX) throw std::invalid_argument(std::string(op) + ": dimension " + std::to_string(v) + " exceeds BLAS int");
  return static_cast<int>(v);
}

// Products below this many multiply-adds run on the calling thread.
constexpr double kParallelMinWork = 1 << 20;

// One block, single-threaded. Leading dimensions must be >= 1 even for empty operands.
void sgemm_block(GemmLibrary library, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  lda = std::max<int64_t>(lda, 1);
  ldb = std::max<int64_t>(ldb, 1);
  if (library == GemmLibrary::onednn) {
    const dnnl_status_t status =
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (status != dnnl_success) {
      throw std::runtime_error("dnnl_sgemm failed (status " + std::to_string(static_cast<int>(status)) + ") for " +
                               std::to_string(M) + " x " + std::to_string(N) + " x " + std::to_string(K));
    }
    return;
  }
  const char* op = "sgemm";
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blas_int(M, op),
              to_blas_int(N, op), to_blas_int(K, op), alpha, A, to_blas_int(lda, op), B, to_blas_int(ldb, op), beta, C,
              to_blas_int(ldc, op));
}

// C = beta C for an empty inner dimension (beta = 0 writes zeros, whatever C held).
void scale_rows(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

}  // namespace

// Each thread computes a contiguous block of C's rows (or of its columns when C is
// wide and short); the split depends only on the shape and the thread count.
void sgemm(GemmLibrary library, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_rows(M, N, beta, C, ldc);
  if (library == GemmLibrary::openblas && blas_num_threads() != 1) set_blas_num_threads(1);
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || static_cast<double>(M) * N * K < kParallelMinWork) {
    sgemm_block(library, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = M >= N;
  const int64_t extent = split_rows ? M : N;
  // Blocks are multiples of 16 so every block starts on a 64-byte boundary of C.
  const int64_t block = (extent / threads + 15) / 16 * 16;
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    const int64_t begin = std::min<int64_t>(extent, block * omp_get_thread_num());
    const int64_t end = omp_get_thread_num() == threads - 1 ? extent : std::min<int64_t>(extent, begin + block);
    if (end > begin) {
      try {
        if (split_rows) {
          // Rows of op(A): rows of A, or columns of A when transposed.
          const float* a = ta ? A + begin : A + begin * lda;
          sgemm_block(library, ta, tb, end - begin, N, K, alpha, a, lda, B, ldb, beta, C + begin * ldc, ldc);
        } else {
          // Columns of op(B): columns of B, or rows of B when transposed.
          const float* b = tb ? B + begin * ldb : B + begin;
          sgemm_block(library, ta, tb, M, end - begin, K, alpha, A, lda, b, ldb, beta, C + begin, ldc);
        }
      } catch (...) {
#pragma omp critical(hdp_sgemm_error)
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

const char* onednn_sgemm_isa() {
  // oneDNN's sgemm driver takes the widest of these kernel families the CPU (and
  // ONEDNN_MAX_CPU_ISA) allows; AMX and VNNI add nothing to fp32 GEMM.
  const unsigned isa = dnnl_get_effective_cpu_isa();
  auto has = [isa](dnnl_cpu_isa_t family) { return (isa & family) == static_cast<unsigned>(family); };
  if (has(dnnl_cpu_isa_avx512_core)) return "avx512_core";
  if (has(dnnl_cpu_isa_avx512_mic)) return "avx512_mic";
  if (has(dnnl_cpu_isa_avx2)) return "avx2";
  if (has(dnnl_cpu_isa_avx)) return "avx";
  if (has(dnnl_cpu_isa_sse41)) return "sse41";
  return "reference";
}

const char* gemm_library_name(GemmLibrary library) {
  return library == GemmLibrary::onednn ? "oneDNN" : "OpenBLAS";
}

std::string gemm_library_description(GemmLibrary library) {
  if (library == GemmLibrary::onednn) {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
           " sgemm, " + onednn_sgemm_isa() + " kernels";
  }
  // openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64"
  std::string config = openblas_get_config() ? openblas_get_config() : "OpenBLAS";
  std::string version = config.substr(0, config.find(' ', config.find(' ') + 1));
  return version + " sgemm, " + blas_core_name() + " kernels";
}

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta) {
  const int64_t M = c.dim(0), N = c.dim(1), K = transpose_a ? a.dim(0) : a.dim(1);
  sgemm(kGemmLibrary, transpose_a, transpose_b, M, N, K, alpha, a.data, a.dim(1), b.data, b.dim(1), beta, c.data, N);
}

// The residual is added after the product (y rounded, then the sum rounded), as a
// GPU's epilogue adds it to the finished fp32 product.
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  sgemm(kGemmLibrary, false, true, T, out, in, 1.0f, x.data, in, w.data, in, 0.0f, y.data, out);
  if (residual.data) cpu::add_inplace(y, residual);
}

void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  // dx[T, in] (+)= dy[T, out] w[out, in]
  if (dx.data) {
    sgemm(kGemmLibrary, false, false, T, in, out, 1.0f, dy.data, out, w.data, in, accumulate_dx ? 1.0f : 0.0f, dx.data,
          in);
  }
  // dw[out, in] += dy^T x
  if (dw.data) sgemm(kGemmLibrary, true, false, out, in, T, 1.0f, dy.data, out, x.data, in, 1.0f, dw.data, in);
}

}  // namespace hdp::cpu
