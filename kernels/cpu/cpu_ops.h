#pragma once
// The CPU backend: one function per op in kernels/ops.h, same arguments. The
// dispatcher (kernels/ops.cpp) has already checked shapes, devices and dtypes (these
// take fp32; the bf16 twins are at the end), so these functions trust their inputs.
// Forward and backward of an op live side by side in one file (cpu/<op>.cpp).
//
// Threading: OpenMP inside each op (static schedule for elementwise work,
// dynamic where tasks write disjoint outputs); matmul/linear split C into blocks
// over the OpenMP threads, each a single-threaded oneDNN sgemm (gemm.h). Every op
// is deterministic for a given thread count, and most (all but matmul/linear,
// whose blocking the library chooses per block shape) give the same bits for any
// thread count. Call ops from one thread at a time: they are not
// meant to be nested inside a caller's OpenMP parallel region.

#include <cstdint>
#include <span>

#include "kernels/ops.h"

namespace hdp::cpu {

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta);
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual);
void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx);

void add_inplace(Tensor y, const Tensor& x);
void scale_inplace(Tensor y, float s);
void fill(Tensor y, float value);
void copy(Tensor dst, const Tensor& src);
double sum_squares(const Tensor& x);

void embedding_forward(Tensor out, const IndexTensor& tokens, const Tensor& table, int64_t vocab_begin);
void embedding_backward(Tensor dtable, const IndexTensor& tokens, const Tensor& dout, int64_t vocab_begin);

void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd);

void rope_forward(Tensor x, const IndexTensor& positions, const RopeSettings& rope, Tensor x2);
void rope_backward(Tensor dx, const IndexTensor& positions, const RopeSettings& rope, Tensor dx2);

void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens, int64_t window);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                        int64_t window);
void attention_forward_blocks(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::span<const AttentionBlock> blocks, int64_t window);
void attention_reset_rows(Tensor out, Tensor lse, int64_t begin, int64_t end);
void attention_backward_blocks(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               std::span<const AttentionBlock> blocks, int64_t window);

void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up,
                     Tensor out);

void gather_rows(Tensor out, const Tensor& x, const IndexTensor& index, const Tensor& scale);
void combine_rows(Tensor out, const Tensor& rows, const IndexTensor& index, const Tensor& weights);
void combine_rows_weight_backward(Tensor dweights, const Tensor& dout, const Tensor& rows, const IndexTensor& index);

void cross_entropy_stats(Tensor row_max, Tensor row_sumexp, Tensor target_logit, const Tensor& logits,
                         const IndexTensor& targets, int64_t vocab_begin);
void cross_entropy_backward_inplace(Tensor logits, const Tensor& lse, const IndexTensor& targets, int64_t vocab_begin,
                                    float grad_scale);
double cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT);
void cross_entropy_rescale_sumexp(Tensor row_sumexp, const Tensor& row_max, const Tensor& global_max);
double cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                                 const Tensor& target_logit, const IndexTensor& targets);

void adamw_update(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWStep& s, Tensor param_bf16);

// The attention tile sizes (exposed for tests and benchmarks): queries per tile
// and keys per tile.
int attention_query_tile();
int attention_key_tile();

}  // namespace hdp::cpu

// The bf16 twins (cpu/bf16.cpp): the same ops and arguments for bf16 tensors, as
// the dtype rules of kernels/ops.cpp allow them (bf16 activations and weights; the
// statistics, log-sum-exp and gradients of weights fp32). Each computes in fp32 and
// rounds once where it stores a bf16 result: the reference for GPU bf16 kernels.
namespace hdp::cpu::bf16_ops {

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta);
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual);
void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx);
void add_inplace(Tensor y, const Tensor& x);
void scale_inplace(Tensor y, float s);
void fill(Tensor y, float value);
void copy(Tensor dst, const Tensor& src);
void embedding_forward(Tensor out, const IndexTensor& tokens, const Tensor& table, int64_t vocab_begin);
void embedding_backward(Tensor dtable, const IndexTensor& tokens, const Tensor& dout, int64_t vocab_begin);
void rmsnorm_forward(Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps);
void rmsnorm_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd);
void rope_forward(Tensor x, const IndexTensor& positions, const RopeSettings& rope, Tensor x2);
void rope_backward(Tensor dx, const IndexTensor& positions, const RopeSettings& rope, Tensor dx2);
void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const IndexTensor& cu_seqlens, int64_t window);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const IndexTensor& cu_seqlens,
                        int64_t window);
void attention_forward_blocks(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::span<const AttentionBlock> blocks, int64_t window);
void attention_reset_rows(Tensor out, Tensor lse, int64_t begin, int64_t end);
void attention_backward_blocks(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               std::span<const AttentionBlock> blocks, int64_t window);
void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate, const Tensor& up,
                     Tensor out);
void gather_rows(Tensor out, const Tensor& x, const IndexTensor& index, const Tensor& scale);
void combine_rows(Tensor out, const Tensor& rows, const IndexTensor& index, const Tensor& weights);
void combine_rows_weight_backward(Tensor dweights, const Tensor& dout, const Tensor& rows, const IndexTensor& index);
void cross_entropy_stats(Tensor row_max, Tensor row_sumexp, Tensor target_logit, const Tensor& logits,
                         const IndexTensor& targets, int64_t vocab_begin);
void cross_entropy_backward_inplace(Tensor logits, const Tensor& lse, const IndexTensor& targets, int64_t vocab_begin,
                                    float grad_scale);
double cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT);

}  // namespace hdp::cpu::bf16_ops
