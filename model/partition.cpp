#include "model/partition.h"

#include <stdexcept>
#include <string>

namespace hdp {
namespace {

// Rows [begin, end) of an even split of n into parts.
int64_t split_point(int64_t n, int part, int parts) { return n * part / parts; }

}  // namespace

ModelSlice::ModelSlice(const ModelConfig& c, const ModelPartition& partition) {
  const int tp_size = partition.tp_size;
  if (c.hidden_size % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0 || c.head_dim() % 2 != 0) {
    throw std::invalid_argument("model: heads must divide hidden size, kv heads must divide heads, head_dim even");
  }
  if (!tp_divides_kv_heads(c.num_kv_heads, tp_size) || c.ffn_hidden_size % tp_size != 0 || c.vocab_size < tp_size) {
    throw std::invalid_argument("model: tensor parallel degree " + std::to_string(tp_size) +
                                " must divide num_kv_heads and ffn_hidden_size");
  }
  if (partition.ep_size < 1 || partition.ep_rank < 0 || partition.ep_rank >= partition.ep_size ||
      (partition.ep_size > 1 && (!c.moe() || c.num_experts % partition.ep_size != 0))) {
    throw std::invalid_argument("model: expert parallelism of " + std::to_string(partition.ep_size) +
                                " needs a mixture of experts whose count it divides");
  }
  first_layer = partition.first_layer;
  num_layers = partition.num_layers < 0 ? c.num_layers - partition.first_layer : partition.num_layers;
  if (partition.first_layer < 0 || num_layers < 0 || partition.first_layer + num_layers > c.num_layers) {
    throw std::invalid_argument("model: layer range outside the model");
  }
  heads = c.num_heads / tp_size;
  kv_heads = c.num_kv_heads / tp_size;
  ffn = c.ffn_hidden_size / tp_size;
  vocab_begin = split_point(c.vocab_size, partition.tp_rank, tp_size);
  vocab = split_point(c.vocab_size, partition.tp_rank + 1, tp_size) - vocab_begin;
  if (partition.sequence_parallel && (tp_size < 2 || c.moe())) {
    throw std::invalid_argument(
        "model: sequence parallelism needs tensor parallelism (tp > 1) and a dense model (Mixtral's experts make "
        "their own tp collectives)");
  }
  sequence_shards = partition.sequence_parallel ? tp_size : 1;
  if (c.moe()) {
    const int64_t per_rank = c.num_experts / partition.ep_size;
    for (int64_t j = 0; j < per_rank; ++j) experts.push_back(partition.ep_rank * per_rank + j);
  }
}

}  // namespace hdp
