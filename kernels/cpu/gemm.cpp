// Dense products through OpenBLAS (cblas_sgemm, row-major). The process runs one
// thread pool, OpenMP's: OpenBLAS is kept at one thread and a large product is
// split into row (or column) blocks of C, one per OpenMP thread. Two pools that
// each spin after their work would steal the cores from one another between the
// GEMMs and the other kernels of a layer.

#include <cblas.h>

#include <omp.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/blas_threads.h"
#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {
namespace {

int to_blas_int(int64_t v, const char* op) {
  if (v > INT_MAX) throw std::invalid_argument(std::string(op) + ": dimension " + std::to_string(v) + " exceeds BLAS int");
  return static_cast<int>(v);
}

// Products below this many multiply-adds run on the calling thread.
constexpr double kParallelMinWork = 1 << 20;

void sgemm_block(const char* op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // BLAS requires leading dimensions >= 1 even for empty operands.
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blas_int(M, op),
              to_blas_int(N, op), to_blas_int(K, op), alpha, A, to_blas_int(lda > 0 ? lda : 1, op), B,
              to_blas_int(ldb > 0 ? ldb : 1, op), beta, C, to_blas_int(ldc, op));
}

// C[M, N] = alpha * op(A) op(B) + beta * C, all row-major. Each thread computes a
// contiguous block of C's rows (or of its columns when C is wide and short); the
// split depends only on the shape and the thread count, so results are
// deterministic for a given thread count.
void sgemm(const char* op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (blas_num_threads() != 1) set_blas_num_threads(1);
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || static_cast<double>(M) * N * K < kParallelMinWork) {
    sgemm_block(op, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = M >= N;
  const int64_t extent = split_rows ? M : N;
  // Blocks are multiples of 16 so every block starts on a 64-byte boundary of C.
  const int64_t block = (extent / threads + 15) / 16 * 16;
#pragma omp parallel num_threads(threads)
  {
    const int64_t begin = std::min<int64_t>(extent, block * omp_get_thread_num());
    const int64_t end = omp_get_thread_num() == threads - 1 ? extent : std::min<int64_t>(extent, begin + block);
    if (end > begin) {
      if (split_rows) {
        // Rows of op(A): rows of A, or columns of A when transposed.
        const float* a = ta ? A + begin : A + begin * lda;
        sgemm_block(op, ta, tb, end - begin, N, K, alpha, a, lda, B, ldb, beta, C + begin * ldc, ldc);
      } else {
        // Columns of op(B): columns of B, or rows of B when transposed.
        const float* b = tb ? B + begin * ldb : B + begin;
        sgemm_block(op, ta, tb, M, end - begin, K, alpha, A, lda, b, ldb, beta, C + begin, ldc);
      }
    }
  }
}

}  // namespace

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta) {
  const int64_t M = c.dim(0), N = c.dim(1), K = transpose_a ? a.dim(0) : a.dim(1);
  sgemm("matmul", transpose_a, transpose_b, M, N, K, alpha, a.data, a.dim(1), b.data, b.dim(1), beta, c.data, N);
}

void linear_forward(Tensor y, const Tensor& x, const Tensor& w) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  sgemm("linear_forward", false, true, T, out, in, 1.0f, x.data, in, w.data, in, 0.0f, y.data, out);
}

void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx) {
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  // dx[T, in] (+)= dy[T, out] w[out, in]
  if (dx.data) sgemm("linear_backward", false, false, T, in, out, 1.0f, dy.data, out, w.data, in,
                     accumulate_dx ? 1.0f : 0.0f, dx.data, in);
  // dw[out, in] += dy^T x
  sgemm("linear_backward", true, false, out, in, T, 1.0f, dy.data, out, x.data, in, 1.0f, dw.data, in);
}

}  // namespace hdp::cpu
