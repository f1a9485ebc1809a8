// Dense products through OpenBLAS (cblas_sgemm, row-major) with OpenBLAS's own
// thread pool: these are called outside any OpenMP region, so BLAS threading
// stays as configured (OPENBLAS_NUM_THREADS / openblas_set_num_threads).

#include <cblas.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu {
namespace {

int to_blas_int(int64_t v, const char* op) {
  if (v > INT_MAX) throw std::invalid_argument(std::string(op) + ": dimension " + std::to_string(v) + " exceeds BLAS int");
  return static_cast<int>(v);
}

// C[M, N] = alpha * op(A) op(B) + beta * C, all row-major.
void sgemm(const char* op, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  // BLAS requires leading dimensions >= 1 even for empty operands.
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blas_int(M, op),
              to_blas_int(N, op), to_blas_int(K, op), alpha, A, to_blas_int(lda > 0 ? lda : 1, op), B,
              to_blas_int(ldb > 0 ? ldb : 1, op), beta, C, to_blas_int(ldc, op));
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
