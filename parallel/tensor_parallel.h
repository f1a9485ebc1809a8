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

// Megatron's vocabulary-parallel cross-entropy: logits [n, V_local] hold this
// rank's vocabulary ids [vocab_begin, vocab_begin + V_local), targets [n] are global
// ids (-1: nothing predicted). The per-row max logit, sum of exponentials and
// target logit are all-reduced over the ranks, so the whole logits are never
// gathered. Returns the sum over predicted rows of lse - target logit (the same on
// every rank) and leaves loss_scale * dloss/dlogits of this slice in logits. The
// backward needs no collective: a slice's softmax - onehot needs only the row's
// global lse, which the forward reduced. Scratch: stats of at least 3n floats and
// global_max of at least n (stats alone with a single rank).
double vocab_parallel_cross_entropy(Communicator* tp, Tensor logits, const IndexTensor& targets, int64_t vocab_begin,
                                    float loss_scale, Tensor stats, Tensor global_max);

}  // namespace hdp
