#include "planning/stage_split.h"

#include "parallel/pipeline.h"

namespace hdp {

std::vector<int64_t> stage_layer_split(const ModelShape& model, int tp, int pp, int64_t seq_len) {
  validate_model_shape(model);
  validate_split(model, tp, pp);
  // A layer counts its attention at the longest sequence: attention grows with the
  // sequence and at long context outweighs the matmuls (LLaMA-7B at 256K tokens:
  // 6.4 GFLOP of attention per token and layer against 1.1 of matmuls), so a split
  // without it weighs the LM head as several layers and starves the last stage. The longest
  // sequence is what is known before the data (a run keeps one split), and packed
  // micro-batches of shorter ones cost less attention per token, which this split
  // then overestimates.
  // The embedding lookup copies one row of hidden values per token on every tp
  // rank (the vocabulary is sharded, the row is not); the layers and the LM head
  // shrink by tp.
  return split_layers(model.layers, pp, layer_flops_per_token(model, tp, seq_len), static_cast<double>(model.hidden),
                      head_flops_per_token(model, tp));
}

}  // namespace hdp
