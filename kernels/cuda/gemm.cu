// Dense products through cuBLASLt. Our tensors are row-major and cuBLAS is
// column-major: a row-major [r, c] matrix is the column-major [c, r] matrix of its
// transpose, so the row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T with the operands swapped; no data moves.
//
// fp32 inputs run with CUBLAS_COMPUTE_32F (exact fp32, the default, used by the
// equality tests) or CUBLAS_COMPUTE_32F_FAST_TF32 (tensor cores, set_tf32).
// bf16 inputs (A and B) run with CUBLAS_COMPUTE_32F on bf16 tensor cores: products
// accumulate in fp32 and C is written as bf16 (rounded once) or fp32 (the weight
// gradients of linear_backward, which accumulate in fp32), the same contract as
// the CPU twins (kernels/cpu/bf16.cpp).
// The algorithm for each (shape, transposes, precision) is chosen once by the
// heuristic and cached, and the workspace is allocated once, so a step makes no
// cuBLASLt planning calls and no allocations after its first micro-batch.

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_runtime.h"

namespace hdp::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLASLt error in ") + what + ": " + cublasLtGetStatusString(status));
  }
}

// The largest power of two up to 256 dividing the address. cuBLASLt assumes 256-byte
// aligned operands unless told otherwise, and an algorithm chosen under that
// assumption fails (CUBLAS_STATUS_NOT_SUPPORTED) or faults on a less aligned pointer:
// arena views start on 64-byte boundaries, bf16 parameters on 32, an expert's rows
// anywhere on a row.
uint32_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// Column-major problem: C[m, n] = alpha * op(A) op(B) + beta * C, with the operands'
// alignments (a plan holds for every pointer at least as aligned as its key's).
struct GemmKey {
  bool trans_a, trans_b, tf32;
  int64_t m, n, k, lda, ldb, ldc;
  bool ab_bf16 = false, c_bf16 = false;  // element types of A and B, and of C
  uint32_t align_a = 256, align_b = 256, align_c = 256;
  auto tie() const {
    return std::tie(trans_a, trans_b, tf32, m, n, k, lda, ldb, ldc, ab_bf16, c_bf16, align_a, align_b, align_c);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

class Blas {
 public:
  Blas() {
    check(cublasLtCreate(&handle_), "cublasLtCreate");
    workspace_ = device_malloc(kWorkspaceBytes);
  }

  const GemmPlan& plan(const GemmKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    GemmPlan p;
    const cublasComputeType_t compute =
        key.tf32 && !key.ab_bf16 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cudaDataType_t ab_type = key.ab_bf16 ? CUDA_R_16BF : CUDA_R_32F, c_type = key.c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    // Stored shapes (column-major rows x cols) of A and B before op().
    const uint64_t a_rows = key.trans_a ? key.k : key.m, a_cols = key.trans_a ? key.m : key.k;
    const uint64_t b_rows = key.trans_b ? key.n : key.k, b_cols = key.trans_b ? key.k : key.n;
    check(cublasLtMatrixLayoutCreate(&p.a, ab_type, a_rows, a_cols, key.lda), "layout A");
    check(cublasLtMatrixLayoutCreate(&p.b, ab_type, b_rows, b_cols, key.ldb), "layout B");
    check(cublasLtMatrixLayoutCreate(&p.c, c_type, key.m, key.n, key.ldc), "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes,
                                               sizeof kWorkspaceBytes),
          "workspace preference");
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
    for (const auto& [attribute, bytes] : alignments)
      check(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes), "alignment preference");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found),
          "cublasLtMatmulAlgoGetHeuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) {
      throw std::runtime_error("cuBLASLt: no algorithm for a " + std::to_string(key.m) + "x" + std::to_string(key.n) +
                               "x" + std::to_string(key.k) + (key.ab_bf16 ? " bf16" : " fp32") + " product");
    }
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
  }

  // D = alpha * op(A) op(B) + beta * C; C and D share a layout and may be one buffer.
  void run(const GemmPlan& p, const void* A, const void* B, const void* C, void* D, float alpha, float beta) {
    check(cublasLtMatmul(handle_, p.desc, &alpha, A, p.a, B, p.b, &beta, C, p.c, D, p.c, &p.algo, workspace_,
                         kWorkspaceBytes, compute_stream()),
          "cublasLtMatmul");
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::mutex mutex_;
  std::map<GemmKey, GemmPlan> plans_;
};

Blas& blas() {
  static Blas b;
  return b;
}

// Row-major c[M, N] = alpha * op(a) op(b) + beta * c_in, with a, b, c contiguous; a and
// b share one dtype (fp32 or bf16), c is fp32 or bf16; c_in is c unless given (a
// tensor of c's shape and dtype, read by the epilogue: c = op(a) op(b) + c_in in one pass).
void gemm_row_major(const Tensor& c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, int64_t M,
                    int64_t N, int64_t K, int64_t lda, int64_t ldb, float alpha, float beta,
                    const Tensor& c_in = Tensor()) {
  if (M == 0 || N == 0) return;
  const Tensor& source = c_in.data ? c_in : c;
  if (K == 0) {
    if (c_in.data) cuda::copy(c, c_in);
    // An empty sum: c = beta * c.
    const Tensor t = c.view({M * N});
    if (beta == 0.0f) {
      cuda::fill(t, 0.0f);
    } else {
      cuda::scale_inplace(t, beta);
    }
    return;
  }
  // Column-major: C^T[N, M] = op(b)^T[N, K] op(a)^T[K, M]; b's storage is the
  // column-major b^T, so op(b)^T needs a transpose exactly when transpose_b is set.
  GemmKey key{transpose_b, transpose_a, tf32(), N, M, K, ldb, lda, N};
  key.ab_bf16 = a.dtype == DType::BF16;
  key.c_bf16 = c.dtype == DType::BF16;
  key.align_a = pointer_alignment(b.raw());
  key.align_b = pointer_alignment(a.raw());
  key.align_c = std::min(pointer_alignment(c.raw()), pointer_alignment(source.raw()));
  Blas& B = blas();
  B.run(B.plan(key), b.raw(), a.raw(), source.raw(), c.raw(), alpha, beta);
}

}  // namespace

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta) {
  const int64_t M = c.dim(0), N = c.dim(1), K = transpose_a ? a.dim(0) : a.dim(1);
  gemm_row_major(c, a, transpose_a, b, transpose_b, M, N, K, a.dim(1), b.dim(1), alpha, beta);
}

// y[T, out] = x[T, in] w[out, in]^T
// With a residual: y = x w^T + residual by the epilogue (beta = 1, C = residual, D = y).
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual) {
  if (!residual.data) return cuda::matmul(y, x, false, w, true, 1.0f, 0.0f);
  gemm_row_major(y, x, false, w, true, y.dim(0), y.dim(1), x.dim(1), x.dim(1), w.dim(1), 1.0f, 1.0f, residual);
}

// dx[T, in] (+)= dy[T, out] w[out, in] (skipped when dx has no data);  dw[out, in] += dy^T x
void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx) {
  if (dx.data) cuda::matmul(dx, dy, false, w, false, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  if (dw.data) cuda::matmul(dw, dy, true, x, false, 1.0f, 1.0f);
}

}  // namespace hdp::cuda
