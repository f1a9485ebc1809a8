#pragma once
// The CUDA backend: one function per op in kernels/ops.h, same arguments, same
// semantics as the CPU backend (kernels/cpu/cpu_ops.h), which is the reference
// every function here is checked against (trainer selftest, tests/gpu_backend_test).
// The dispatcher (kernels/ops.cpp) has already checked shapes, dtypes and that every
// tensor lives on Device::CUDA, so these functions trust their inputs. Every op takes
// the dtypes check_dtypes allows: fp32, or bf16 activations and weights with the
// semantics of the CPU bf16 twins (kernels/cpu/bf16.cpp; common.cuh).
//
// Stream semantics: every op is enqueued on the backend's compute stream
// (cuda_runtime.h) and returns without waiting, except the ones that return a
// host value (sum_squares, cross_entropy_forward_backward), which synchronize
// that stream. Host-side arguments (AttentionBlock spans, AdamWStep) are copied
// before the function returns, so the caller may reuse them at once.
//
// This header is plain C++: ops.cpp (compiled by the host compiler) includes it.

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/ops.h"

namespace hdp::cuda {

void matmul(Tensor c, const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, float alpha, float beta);
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& residual);
void linear_backward(Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, bool accumulate_dx);

void add_inplace(Tensor y, const Tensor& x);
void scale_inplace(Tensor y, float s);
void fill(Tensor y, float value);
// Either side may be on the host (Device::CPU) or on the GPU.
void copy(Tensor dst, const Tensor& src);
void copy_index(IndexTensor dst, const IndexTensor& src);
// From page-locked host memory, enqueued on the compute stream without a wait.
void copy_index_async(IndexTensor dst, const IndexTensor& src);
double sum_squares(const Tensor& x);
// Sums on the device (kernels/ops.h): fp64 elements, added into by single-thread or
// single-block kernels in a fixed order.
void fill(DoubleTensor y, double value);
void add_inplace(DoubleTensor y, const DoubleTensor& x);
void add_scalar(DoubleTensor y, double value);
void sum_squares(const Tensor& x, DoubleTensor sum);
void read_back(const DoubleTensor& x, std::span<double> out);

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
void cross_entropy_forward_backward(Tensor logits, const IndexTensor& targets, float grad_scale, Tensor scratch_3xT,
                                    DoubleTensor loss_sum);
void cross_entropy_rescale_sumexp(Tensor row_sumexp, const Tensor& row_max, const Tensor& global_max);
double cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                                 const Tensor& target_logit, const IndexTensor& targets);
void cross_entropy_global_loss(Tensor lse, const Tensor& global_max, const Tensor& row_sumexp,
                               const Tensor& target_logit, const IndexTensor& targets, DoubleTensor loss_sum);

void adamw_update(Tensor param, const Tensor& grad, Tensor m, Tensor v, const AdamWStep& s, Tensor param_bf16);

}  // namespace hdp::cuda
