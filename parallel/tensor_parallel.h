#pragma once
// Tensor parallelism's collectives, after Megatron-LM (Shoeybi et al. 2019,
// "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
// Parallelism"). A column-parallel layer (weight split by output rows) followed by
// a row-parallel one (weight split by input columns) needs communication only at
// the two ends of the pair, through the paper's conjugate operators:
//   f (CopyToTensorParallelRegion): identity forward, all-reduce backward, in
//     front of the column-parallel layer;
//   g (ReduceFromTensorParallelRegion): all-reduce forward, identity backward,
//     behind the row-parallel layer.
// Each region defines its forward and its backward side by side, so a caller runs
// one region object's forward in the forward pass and the same object's backward
// in the backward pass, and the backward collective cannot go missing. The
// identity sides return their argument, so the data flows through them.
//
// Without a communicator, or with a group of one rank, every side is the identity.
// Tensors may live on any device; nothing here touches their elements on the host.

#include <cstdint>

#include "kernels/tensor.h"
#include "parallel/communicator.h"

namespace hdp {

// Whether tp splits the layers: a communicator of more than one rank. Otherwise every
// region below is the identity (a caller may then fuse across it).
bool splits(const Communicator* tp);

// Megatron's f: the input of column-parallel layers.
class CopyToTensorParallelRegion {
 public:
  explicit CopyToTensorParallelRegion(Communicator* tp = nullptr) : tp_(tp) {}
  // Identity: every rank holds the whole input and its slice of the layers reads it as is.
  Tensor forward(const Tensor& input) const { return input; }
  // Each rank's slice of the layers gave a partial gradient of the input; every
  // rank ends with their sum, in place.
  void backward(Tensor input_grad) const;

 private:
  Communicator* tp_;
};

// Megatron's g: the output of row-parallel layers (and of the vocabulary-parallel
// embedding, whose ranks each look up only the tokens of their vocabulary slice).
class ReduceFromTensorParallelRegion {
 public:
  explicit ReduceFromTensorParallelRegion(Communicator* tp = nullptr) : tp_(tp) {}
  // Each rank computed a partial output; every rank ends with their sum, in place.
  void forward(Tensor partial_output) const;
  // Identity: the output's gradient is whole on every rank, and each rank's slice
  // of the layer needs all of it.
  Tensor backward(const Tensor& output_grad) const { return output_grad; }

 private:
  Communicator* tp_;
};

// Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation
// in Large Transformer Models", section 4.2.2): outside attention and the MLP (the
// norms and the residual adds) rank r of tp holds only rows [r n, (r + 1) n) of the
// sequence, n = rows / tp, so the all-reduce of g becomes a reduce-scatter onto those
// rows and the identity of f an all-gather of them; each is the other's backward.
// A shard is [n, width], the whole sequence [tp n, width] (callers pad the rows to a
// multiple of tp: the collectives split buffers evenly). Without a communicator, or
// with a group of one rank, the shard is the whole sequence and every side a copy.

// In front of the column-parallel layers: forward all-gathers the ranks' shards into
// the whole sequence, backward reduce-scatters the layers' partial gradients of it.
class GatherFromSequenceParallelRegion {
 public:
  explicit GatherFromSequenceParallelRegion(Communicator* tp = nullptr) : tp_(tp) {}
  // gathered = the shards of every rank in rank order; returns gathered.
  Tensor forward(const Tensor& shard, Tensor gathered) const;
  // shard_grad = the sum over ranks of their gathered_grad's rows of this rank's shard.
  void backward(const Tensor& gathered_grad, Tensor shard_grad) const;

 private:
  Communicator* tp_;
};

// Behind the row-parallel layers (and the vocabulary-parallel embedding): forward
// reduce-scatters the ranks' partial outputs onto the shards, backward all-gathers
// the shards' gradients, which every rank's slice of the layers needs whole.
class ReduceScatterToSequenceParallelRegion {
 public:
  explicit ReduceScatterToSequenceParallelRegion(Communicator* tp = nullptr) : tp_(tp) {}
  // shard = the sum over ranks of their partial_output's rows of this rank's shard.
  void forward(const Tensor& partial_output, Tensor shard) const;
  // gathered_grad = the shards' gradients of every rank in rank order; returns gathered_grad.
  Tensor backward(const Tensor& shard_grad, Tensor gathered_grad) const;

 private:
  Communicator* tp_;
};

// Megatron's vocabulary-parallel cross-entropy: logits [n, V_local] hold this
// rank's vocabulary ids [vocab_begin, vocab_begin + V_local), targets [n] are global
// ids (-1: nothing predicted). The per-row max logit, sum of exponentials and
// target logit are all-reduced over the ranks, so the whole logits are never
// gathered. Adds into loss_sum[0] (a sum on the device, kernels/ops.h) the sum over
// predicted rows of lse - target logit (the same on every rank) and leaves
// loss_scale * dloss/dlogits of this slice in logits. The backward needs no
// collective: a slice's softmax - onehot needs only the row's global lse, which the
// forward reduced. Scratch: stats of at least 3n floats and
// global_max of at least n (stats alone with a single rank).
void vocab_parallel_cross_entropy(Communicator* tp, Tensor logits, const IndexTensor& targets, int64_t vocab_begin,
                                  float loss_scale, Tensor stats, Tensor global_max, DoubleTensor loss_sum);

}  // namespace hdp
