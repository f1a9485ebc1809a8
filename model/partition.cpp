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
  chunks = partition.chunks;
  if (chunks.empty()) {
    chunks.push_back({partition.first_layer,
                      partition.num_layers < 0 ? c.num_layers - partition.first_layer : partition.num_layers});
  }
  num_layers = 0;
  for (const LayerRange& r : chunks) {
    if (r.first < 0 || r.count < 0 || r.first + r.count > c.num_layers) {
      throw std::invalid_argument("model: layer range outside the model");
    }
    num_layers += r.count;
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

int64_t ModelSlice::global_layer(int64_t local) const {
  for (const LayerRange& r : chunks) {
    if (local < r.count) return r.first + local;
    local -= r.count;
  }
  throw std::out_of_range("model: layer " + std::to_string(local) + " past the rank's chunks");
}

int64_t ModelSlice::chunk_begin(size_t chunk) const {
  int64_t begin = 0;
  for (size_t c = 0; c < chunk; ++c) begin += chunks.at(c).count;
  return begin;
}

}  // namespace hdp
