#pragma once
// Which part of the model a rank holds, and that part in numbers. One LlamaModel
// is one rank's part of the network: a pipeline stage (a range of layers, plus the
// embedding on the first stage and the final norm, LM head and loss on the last), a
// tensor-parallel slice of it (Megatron style, Shoeybi et al. 2019: heads and FFN
// columns split across ranks, the vocabulary split for the embedding and the LM
// head) and, for Mixtral under expert parallelism, a share of every layer's experts.

#include <cstdint>
#include <vector>

#include "spec/model_config.h"

namespace hdp {

// A contiguous range of the model's layers.
struct LayerRange {
  int64_t first = 0;
  int64_t count = 0;
};

// Which part of the model this rank holds.
struct ModelPartition {
  int tp_rank = 0;
  int tp_size = 1;
  int64_t first_layer = 0;
  int64_t num_layers = -1;   // -1: every layer from first_layer on
  // Interleaved 1F1B (parallel.vpp > 1, planning/pipeline_schedule.h): the stage's
  // model chunks in order, each a range of layers (chunk c of stage s is virtual
  // stage c x pp + s), in place of first_layer and num_layers. Empty: one chunk.
  // The embedding is chunk 0's (on the first stage), the head the last chunk's (on
  // the last stage).
  std::vector<LayerRange> chunks;
  bool has_embedding = true; // first pipeline stage
  bool has_head = true;      // last pipeline stage: final norm, LM head, loss
  // Mixtral under expert parallelism (model/moe.h): this rank holds experts
  // [ep_rank E / ep_size, (ep_rank + 1) E / ep_size) of every MoE layer.
  int ep_rank = 0;
  int ep_size = 1;
  // Sequence parallelism (Korthikanti et al. 2022) over the tp ranks: the norms and
  // the residual stream hold this rank's shard of the sequence (ModelSlice::shard_rows).
  bool sequence_parallel = false;
};

// Rows of one of `shards` equal shards of a sequence of `tokens` tokens padded to a
// multiple of the shards.
inline int64_t sequence_shard_rows(int64_t tokens, int shards) { return (tokens + shards - 1) / shards; }

// The sizes of this rank's part, which its parameters, activations and blocks all
// take from here.
struct ModelSlice {
  // Throws std::invalid_argument when the partition does not split the config: heads
  // that do not divide the hidden size, a tp degree that does not divide the KV heads
  // and the FFN, an ep degree that does not divide the experts, layers outside the model.
  ModelSlice(const ModelConfig& config, const ModelPartition& partition);

  // The stage's model chunks (ModelPartition::chunks; one without interleaving). The
  // rank numbers its layers 0 .. num_layers - 1 through the chunks in order.
  std::vector<LayerRange> chunks;
  int64_t num_layers = 0;   // of this stage, all chunks
  // The model's layer that the rank's layer `local` is.
  int64_t global_layer(int64_t local) const;
  // The rank's number of chunk c's first layer; chunk_begin(chunks.size()) = num_layers.
  int64_t chunk_begin(size_t chunk) const;
  int64_t heads = 0;        // query heads of this tp rank
  int64_t kv_heads = 0;     // its key/value heads
  int64_t ffn = 0;          // its FFN columns (of every expert, for Mixtral)
  int64_t vocab_begin = 0;  // its vocabulary range [vocab_begin, vocab_begin + vocab)
  int64_t vocab = 0;
  // Mixtral: the experts this rank holds (all, or its share under expert parallelism).
  std::vector<int64_t> experts;
  // Ranks the sequence of the norms and the residual stream is split over: tp under
  // sequence parallelism, else 1. Rank r holds rows [r n, (r + 1) n) of a micro-batch
  // of T tokens, n = shard_rows(T): T padded with zero rows to a multiple of the
  // shards, so that every rank's part of the even all-gather and reduce-scatter
  // (parallel/communicator.h) is whole rows.
  int sequence_shards = 1;
  int64_t shard_rows(int64_t tokens) const { return sequence_shard_rows(tokens, sequence_shards); }
};

}  // namespace hdp
