#include "parallel/tensor_parallel.h"

#include <stdexcept>
#include <string>

#include "kernels/ops.h"
#include "parallel/op_tracer.h"

namespace hdp {

bool splits(const Communicator* tp) { return tp != nullptr && tp->size() > 1; }

namespace {

// The rows of every rank's shard, in rank order, into gathered (parallel/tensor_parallel.h,
// sequence parallelism); one rank: a copy.
Tensor gather_shards(Communicator* tp, const Tensor& shard, Tensor gathered) {
  const int ranks = splits(tp) ? tp->size() : 1, rank = splits(tp) ? tp->rank() : 0;
  const int64_t n = shard.dim(0);
  if (gathered.dim(0) != ranks * n || gathered.numel() != ranks * shard.numel())
    throw std::invalid_argument("sequence parallelism: a shard of " + std::to_string(n) + " rows gathers into " +
                                std::to_string(ranks * n) + " rows, not " + std::to_string(gathered.dim(0)));
  const Tensor own = gathered.rows(rank * n, (rank + 1) * n);
  if (own.raw() != shard.raw()) copy(own, shard);
  if (ranks > 1) {
    TraceSpan span(trace_ops::kSequenceParallelAllGather.data());  // nested in forward- or backward-compute
    tp->all_gather(gathered);
  }
  return gathered;
}

// The sum over ranks of their whole's rows of this rank's shard; one rank: a copy.
void reduce_scatter_shards(Communicator* tp, const Tensor& whole, Tensor shard) {
  if (!splits(tp)) {
    if (whole.raw() != shard.raw()) copy(shard, whole);
    return;
  }
  TraceSpan span(trace_ops::kSequenceParallelReduceScatter.data());  // nested in forward- or backward-compute
  tp->reduce_scatter(whole, shard);
}

}  // namespace

Tensor GatherFromSequenceParallelRegion::forward(const Tensor& shard, Tensor gathered) const {
  return gather_shards(tp_, shard, gathered);
}

void GatherFromSequenceParallelRegion::backward(const Tensor& gathered_grad, Tensor shard_grad) const {
  reduce_scatter_shards(tp_, gathered_grad, shard_grad);
}

void ReduceScatterToSequenceParallelRegion::forward(const Tensor& partial_output, Tensor shard) const {
  reduce_scatter_shards(tp_, partial_output, shard);
}

Tensor ReduceScatterToSequenceParallelRegion::backward(const Tensor& shard_grad, Tensor gathered_grad) const {
  return gather_shards(tp_, shard_grad, gathered_grad);
}

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

void vocab_parallel_cross_entropy(Communicator* tp, Tensor logits, const IndexTensor& targets, int64_t vocab_begin,
                                  float loss_scale, Tensor stats, Tensor global_max, DoubleTensor loss_sum) {
  if (!splits(tp)) return cross_entropy_forward_backward(logits, targets, loss_scale, stats, loss_sum);
  const int64_t n = logits.dim(0);
  const Tensor row_max = stats.rows(0, n), sumexp = stats.rows(n, 2 * n), target_logit = stats.rows(2 * n, 3 * n);
  cross_entropy_stats(row_max, sumexp, target_logit, logits, targets, vocab_begin);
  const Tensor row_global_max = global_max.rows(0, n);
  copy(row_global_max, row_max);
  tp->all_reduce(row_global_max, ReduceOp::Max);
  cross_entropy_rescale_sumexp(sumexp, row_max, row_global_max);
  tp->all_reduce(stats.rows(n, 3 * n), ReduceOp::Sum);  // sums of exponentials and target logits, in one call
  const Tensor lse = row_max;  // reused: the global log-sum-exp per row
  cross_entropy_global_loss(lse, row_global_max, sumexp, target_logit, targets, loss_sum);
  cross_entropy_backward_inplace(logits, lse, targets, vocab_begin, loss_scale);
}

}  // namespace hdp
