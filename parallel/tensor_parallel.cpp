#include "parallel/tensor_parallel.h"

#include "kernels/ops.h"
#include "parallel/op_tracer.h"

namespace hdp {
namespace {

bool splits(const Communicator* tp) { return tp != nullptr && tp->size() > 1; }

}  // namespace

void CopyToTensorParallelRegion::backward(Tensor input_grad) const {
  if (!splits(tp_)) return;
  TraceSpan span(trace_ops::kTensorParallelAllReduce.data());  // nested in backward-compute
  tp_->all_reduce(input_grad, ReduceOp::Sum);
}

void ReduceFromTensorParallelRegion::forward(Tensor partial_output) const {
  if (!splits(tp_)) return;
  TraceSpan span(trace_ops::kTensorParallelAllReduce.data());  // nested in forward-compute
  tp_->all_reduce(partial_output, ReduceOp::Sum);
}

double vocab_parallel_cross_entropy(Communicator* tp, Tensor logits, const IndexTensor& targets, int64_t vocab_begin,
                                    float loss_scale, Tensor stats, Tensor global_max) {
  if (!splits(tp)) return cross_entropy_forward_backward(logits, targets, loss_scale, stats);
  const int64_t n = logits.dim(0);
  const Tensor row_max = stats.rows(0, n), sumexp = stats.rows(n, 2 * n), target_logit = stats.rows(2 * n, 3 * n);
  cross_entropy_stats(row_max, sumexp, target_logit, logits, targets, vocab_begin);
  const Tensor row_global_max = global_max.rows(0, n);
  copy(row_global_max, row_max);
  tp->all_reduce(row_global_max, ReduceOp::Max);
  cross_entropy_rescale_sumexp(sumexp, row_max, row_global_max);
  tp->all_reduce(stats.rows(n, 3 * n), ReduceOp::Sum);  // sums of exponentials and target logits, in one call
  const Tensor lse = row_max;  // reused: the global log-sum-exp per row
  const double loss = cross_entropy_global_loss(lse, row_global_max, sumexp, target_logit, targets);
  cross_entropy_backward_inplace(logits, lse, targets, vocab_begin, loss_scale);
  return loss;
}

}  // namespace hdp
