// The bf16 twins of the CPU ops: the reference semantics of every bf16 op, which
// the CUDA bf16 kernels must equal op by op.
//
// One rule for every op: read bf16 inputs exactly (widened to fp32), compute in
// fp32 with the fp32 kernel of the op, and round once, to nearest even, where a
// bf16 result is stored. fp32 arguments (RMSNorm's 1/rms, attention's log-sum-exp,
// the cross-entropy statistics, the gradients of weights) are passed through and
// stay fp32. That is what a BF16 GPU kernel does: bf16 operands, fp32 arithmetic
// and accumulators (tensor cores accumulate bf16 products in fp32), one rounding on
// store (Micikevicius et al. 2018, "Mixed Precision Training"; Kalamkar et al.
// 2019, "A Study of BFLOAT16 for Deep Learning Training"). Ops that add into a bf16
// result (dx of linear_backward with accumulate, RMSNorm's dx, the block variant of
// attention) add in fp32 and round the sum once.
//
// Correct rather than fast: each op widens whole tensors into fp32 scratch. The
// scratch is per thread (the copy engine's worker calls copy) and only grows, so
// after the first step of a run nothing is allocated; it is host memory outside
// the activation arena.

#include <omp.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace hdp::cpu::bf16_ops {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // below this an OpenMP fork costs more than it saves
constexpr int kScratchSlots = 9;           // the most bf16 tensors one op takes (attention backward)

thread_local std::array<std::vector<float>, kScratchSlots> scratch_buffers;

// An fp32 tensor of t's shape in scratch slot `slot`; its contents are undefined.
Tensor scratch_like(const Tensor& t, int slot) {
  std::vector<float>& buffer = scratch_buffers[slot];
  const size_t n = static_cast<size_t>(t.numel());
  if (buffer.size() < n) buffer.resize(n);
  Tensor f = t;
  f.data = buffer.data();
  f.dtype = DType::F32;
  return f;
}

void widen_into(float* __restrict dst, const hdp::bf16* __restrict src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

void round_into(hdp::bf16* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

// The fp32 image of an input: t itself when fp32, else its exact widening.
Tensor widen(const Tensor& t, int slot) {
  if (t.dtype == DType::F32) return t;
  Tensor f = scratch_like(t, slot);
  widen_into(f.data, t.bf16_data(), t.numel());
  return f;
}

// Where an fp32 kernel writes a result that will be stored into `t`.
Tensor output(const Tensor& t, int slot) { return t.dtype == DType::F32 ? t : scratch_like(t, slot); }

// Stores an fp32 result into its bf16 destination, rounding once (nothing to do
// when the destination was fp32 and the kernel wrote it directly).
void store(const Tensor& dst, const Tensor& result) {
  if (dst.dtype == DType::F32) return;
  round_into(dst.bf16_data(), result.data, dst.numel());
}

}  // namespace

// ---- dense algebra ------------------------------------------------------------------
// The GEMMs read bf16 operands exactly and accumulate in fp32 (oneDNN's sgemm on
// the widened operands), as cuBLASLt does with bf16 inputs and fp32 compute.

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta) {
  const Tensor A = widen(a, 0), B = widen(b, 1);
  const Tensor C = beta != 0.0f ? widen(c, 2) : output(c, 2);
  cpu::matmul(C, A, transpose_a, B, transpose_b, alpha, beta);
  store(c, C);
}

// With a residual: the fp32 product plus the widened residual, rounded once.
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual) {
  const Tensor X = widen(x, 0), W = widen(w, 1), Y = output(y, 2);
  cpu::linear_forward(Y, X, W, residual.data ? widen(residual, 3) : Tensor());
  store(y, Y);
}

// dw is fp32 (the gradient buffer) and accumulates in fp32 across micro-batches.
void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx) {
  const bool skip_dx = dx.ndim == 0 && dx.data == nullptr;
  // x is read for dw only; w for dx only.
  const Tensor DY = widen(dy, 0), X = dw.data ? widen(x, 1) : x, W = skip_dx ? w : widen(w, 2);
  const Tensor DX = skip_dx ? Tensor{} : accumulate_dx ? widen(dx, 3) : output(dx, 3);
  cpu::linear_backward(DX, dw, DY, X, W, accumulate_dx);
  if (!skip_dx) store(dx, DX);
}

// ---- elementwise --------------------------------------------------------------------

void add_inplace(Tensor y, const Tensor& x) {
  const int64_t n = y.numel();
  hdp::bf16* __restrict yd = y.bf16_data();
  const hdp::bf16* __restrict xd = x.bf16_data();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) yd[i] = to_bf16(to_float(yd[i]) + to_float(xd[i]));
}

void scale_inplace(Tensor y, float s) {
  const int64_t n = y.numel();
  hdp::bf16* __restrict yd = y.bf16_data();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) yd[i] = to_bf16(to_float(yd[i]) * s);
}

void fill(Tensor y, float value) {
  const int64_t n = y.numel();
  hdp::bf16* __restrict yd = y.bf16_data();
  const hdp::bf16 v = to_bf16(value);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) yd[i] = v;
}

// Any pair of fp32 and bf16: equal dtypes copy bytes, fp32 -> bf16 rounds to
// nearest even (how the bf16 weights are refreshed from the fp32 master weights),
// bf16 -> fp32 widens exactly.
void copy(Tensor dst, const Tensor& src) {
  const int64_t n = src.numel();
  if (n == 0 || dst.data == src.data) return;
  if (dst.dtype == src.dtype) {
    std::memcpy(dst.raw(), src.raw(), src.bytes());
  } else if (dst.dtype == DType::BF16) {
    round_into(dst.bf16_data(), src.f32(), n);
  } else {
    widen_into(dst.f32(), src.bf16_data(), n);
  }
}

// ---- embedding ----------------------------------------------------------------------

// A row lookup moves bf16 values unchanged (widening and rounding back is exact).
void embedding_forward(Tensor out, const IndexTensor& tokens, const Tensor& table, int64_t vocab_begin) {
  const int64_t T = out.dim(0), H = out.dim(1), V = table.dim(0);
  hdp::bf16* o = out.bf16_data();
  const hdp::bf16* tab = table.bf16_data();
#pragma omp parallel for schedule(static) if (T * H >= kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = static_cast<int64_t>(tokens.data[t]) - vocab_begin;
    if (id >= 0 && id < V) {
      std::memcpy(o + t * H, tab + id * H, static_cast<size_t>(H) * sizeof(hdp::bf16));
    } else {
      std::memset(o + t * H, 0, static_cast<size_t>(H) * sizeof(hdp::bf16));
    }
  }
}

// dtable is fp32 (the gradient buffer).
void embedding_backward(Tensor dtable, const IndexTensor& tokens, const Tensor& dout, int64_t vocab_begin) {
  cpu::embedding_backward(dtable, tokens, widen(dout, 0), vocab_begin);
}

// ---- RMSNorm: statistics and 1/rms in fp32 --------------------------------------------

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) {
  const Tensor X = widen(x, 0), W = widen(w, 1), Y = output(y, 2);
  cpu::rmsnorm_forward(Y, rstd, X, W, eps);
  store(y, Y);
}

void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const Tensor DX = widen(dx, 0), DY = widen(dy, 1), X = widen(x, 2), W = widen(w, 3);
  cpu::rmsnorm_backward(DX, dw, DY, X, W, rstd);
  store(dx, DX);
}

// ---- RoPE ---------------------------------------------------------------------------

void rope_forward(Tensor x, const IndexTensor& positions, const RopeSettings& rope, Tensor x2) {
  const Tensor X = widen(x, 0), X2 = x2.data ? widen(x2, 1) : Tensor();
  cpu::rope_forward(X, positions, rope, X2);
  store(x, X);
  if (x2.data) store(x2, X2);
}

void rope_backward(Tensor dx, const IndexTensor& positions, const RopeSettings& rope, Tensor dx2) {
  const Tensor DX = widen(dx, 0), DX2 = dx2.data ? widen(dx2, 1) : Tensor();
  cpu::rope_backward(DX, positions, rope, DX2);
  store(dx, DX);
  if (dx2.data) store(dx2, DX2);
}

// ---- attention: scores, softmax and log-sum-exp in fp32 --------------------------------

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens, int64_t window) {
  const Tensor Q = widen(q, 0), K = widen(k, 1), V = widen(v, 2), OUT = output(out, 3);
  cpu::attention_forward(OUT, lse, Q, K, V, cu_seqlens, window);
  store(out, OUT);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                        int64_t window) {
  const Tensor DOUT = widen(dout, 0), Q = widen(q, 1), K = widen(k, 2), V = widen(v, 3), OUT = widen(out, 4);
  const Tensor DQ = output(dq, 5), DK = output(dk, 6), DV = output(dv, 7);
  cpu::attention_backward(DQ, DK, DV, DOUT, Q, K, V, OUT, lse, cu_seqlens, window);
  store(dq, DQ);
  store(dk, DK);
  store(dv, DV);
}

// The running output of earlier key blocks is merged in fp32 and rounded once per
// call; rows no block touches round-trip exactly.
void attention_forward_blocks(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::span<const AttentionBlock> blocks, int64_t window) {
  const Tensor Q = widen(q, 0), K = widen(k, 1), V = widen(v, 2), OUT = widen(out, 3);
  cpu::attention_forward_blocks(OUT, lse, Q, K, V, blocks, window);
  store(out, OUT);
}

void attention_reset_rows(Tensor out, Tensor lse, int64_t begin, int64_t end) {
  const int64_t row = out.row_numel(), T = out.dim(0), heads = out.dim(1);
  std::memset(out.bf16_data() + begin * row, 0, static_cast<size_t>((end - begin) * row) * sizeof(hdp::bf16));
  float* l = lse.f32();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = begin; t < end; ++t) l[h * T + t] = -std::numeric_limits<float>::infinity();
}

void attention_backward_blocks(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               std::span<const AttentionBlock> blocks, int64_t window) {
  const Tensor DOUT = widen(dout, 0), Q = widen(q, 1), K = widen(k, 2), V = widen(v, 3), OUT = widen(out, 4);
  const Tensor DQ = widen(dq, 5), DK = widen(dk, 6), DV = widen(dv, 7);
  cpu::attention_backward_blocks(DQ, DK, DV, DOUT, Q, K, V, OUT, lse, blocks, window);
  store(dq, DQ);
  store(dk, DK);
  store(dv, DV);
}

// ---- SwiGLU -------------------------------------------------------------------------

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up) {
  const Tensor G = widen(gate, 0), U = widen(up, 1), OUT = output(out, 2);
  cpu::swiglu_forward(OUT, G, U);
  store(out, OUT);
}

void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor out) {
  const Tensor DOUT = widen(dout, 0), G = widen(gate, 1), U = widen(up, 2), DG = output(dgate, 3),
               DU = output(dup, 4), OUT = out.data ? output(out, 5) : Tensor();
  cpu::swiglu_backward(DG, DU, DOUT, G, U, OUT);
  store(dgate, DG);
  store(dup, DU);
  if (out.data) store(out, OUT);
}

// ---- mixture-of-experts row movement: scale, weights and dweights fp32 -----------------

void gather_rows(Tensor out, const Tensor& x, const IndexTensor& index, const Tensor& scale) {
  const Tensor X = widen(x, 0), OUT = output(out, 1);
  cpu::gather_rows(OUT, X, index, scale);
  store(out, OUT);
}

void combine_rows(Tensor out, const Tensor& rows, const IndexTensor& index, const Tensor& weights) {
  const Tensor R = widen(rows, 0), OUT = output(out, 1);
  cpu::combine_rows(OUT, R, index, weights);
  store(out, OUT);
}

void combine_rows_weight_backward(Tensor dweights, const Tensor& dout, const Tensor& rows, const IndexTensor& index) {
  cpu::combine_rows_weight_backward(dweights, widen(dout, 0), widen(rows, 1), index);
}

// ---- cross-entropy over bf16 logits: the on-line max, the sums of exponentials,
// the log-sum-exp and the loss in fp32 (double for the loss sum) ------------------------

void cross_entropy_stats(Tensor row_max, Tensor row_sumexp, Tensor target_logit, const Tensor& logits,
                         const IndexTensor& targets, int64_t vocab_begin) {
  cpu::cross_entropy_stats(row_max, row_sumexp, target_logit, widen(logits, 0), targets, vocab_begin);
}

void cross_entropy_backward_inplace(Tensor logits, const Tensor& lse, const IndexTensor& targets, int64_t vocab_begin,
                                    float grad_scale) {
  const Tensor L = widen(logits, 0);
  cpu::cross_entropy_backward_inplace(L, lse, targets, vocab_begin, grad_scale);
  store(logits, L);
}

double cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT) {
  const Tensor L = widen(logits, 0);
  const double loss = cpu::cross_entropy_forward_backward(L, targets, grad_scale, scratch_3xT);
  store(logits, L);
  return loss;
}

}  // namespace hdp::cpu::bf16_ops
