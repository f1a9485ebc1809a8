// The parameter table as the ZeRO-1 optimizer sees it (flat_parameters): which
// tensors decay, which count in the global gradient norm, which are reduced over the
// expert-data-parallel group and which wait for the tied embeddings' sync; and the
// partitions a ModelSlice refuses.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "model/model.h"

namespace hdp {
namespace {

ModelConfig tiny(bool tied) {
  ModelConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 12;
  c.tie_embeddings = tied;
  return c;
}

// The optimizer's entry of the parameter called `name`.
FlatParameter entry(const LlamaModel& model, const std::string& name) {
  const std::vector<FlatParameter> flat = flat_parameters(model.parameter_table());
  const std::vector<ParameterInfo>& table = model.parameters();
  EXPECT_EQ(flat.size(), table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].name != name) continue;
    EXPECT_EQ(flat[i].offset, table[i].offset);
    EXPECT_EQ(flat[i].numel, table[i].numel);
    return flat[i];
  }
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

TEST(FlatParameters, MatricesDecayAndNormWeightsDoNot) {
  const LlamaModel model(tiny(false), 4);
  EXPECT_TRUE(entry(model, "model.embed_tokens.weight").weight_decay);
  EXPECT_TRUE(entry(model, "model.layers.0.self_attn.q_proj.weight").weight_decay);
  EXPECT_TRUE(entry(model, "lm_head.weight").weight_decay);
  EXPECT_FALSE(entry(model, "model.layers.1.input_layernorm.weight").weight_decay);
  EXPECT_FALSE(entry(model, "model.norm.weight").weight_decay);
}

// Replicated tensors (the norm weights) hold the same gradient on every tp rank, so
// only tp rank 0 counts them; split tensors count on every rank.
TEST(FlatParameters, TensorParallelReplicasCountInTheNormOnRankZeroOnly) {
  for (int tp_rank : {0, 1}) {
    SCOPED_TRACE("tp rank " + std::to_string(tp_rank));
    // A tp slice without its communicator holds weights (it cannot run).
    const LlamaModel model(tiny(false), 4, ModelPartition{.tp_rank = tp_rank, .tp_size = 2});
    EXPECT_EQ(entry(model, "model.layers.0.post_attention_layernorm.weight").counts_in_norm, tp_rank == 0);
    EXPECT_EQ(entry(model, "model.norm.weight").counts_in_norm, tp_rank == 0);
    EXPECT_TRUE(entry(model, "model.layers.0.mlp.down_proj.weight").counts_in_norm);
    EXPECT_TRUE(entry(model, "lm_head.weight").counts_in_norm);
  }
}

// Tied embeddings over two pipeline stages: the last stage's copy never counts, and
// both copies' gradients are completed by their sync before the optimizer reduces them.
TEST(FlatParameters, TiedEmbeddingsAcrossStagesSyncFirstAndCountOnTheFirstStageOnly) {
  const LlamaModel first(tiny(true), 4, ModelPartition{.num_layers = 1, .has_head = false});
  const LlamaModel last(tiny(true), 4, ModelPartition{.first_layer = 1, .has_embedding = false});
  const FlatParameter embedding = entry(first, "model.embed_tokens.weight");
  const FlatParameter copy = entry(last, "model.embed_tokens.weight");
  EXPECT_TRUE(embedding.counts_in_norm);
  EXPECT_TRUE(embedding.synced_later);
  EXPECT_FALSE(copy.counts_in_norm);
  EXPECT_TRUE(copy.synced_later);
  EXPECT_FALSE(entry(last, "model.norm.weight").synced_later);
  // One stage holding both ends needs no sync.
  EXPECT_FALSE(entry(LlamaModel(tiny(true), 4), "model.embed_tokens.weight").synced_later);
}

// Mixtral: experts are reduced over the expert-data-parallel group only when they
// are shared out; the router never is.
TEST(FlatParameters, ExpertsGoToTheExpertDataParallelGroupUnderExpertParallelismOnly) {
  ModelConfig c = tiny(false);
  c.arch = "mixtral";
  c.num_experts = 4;
  const LlamaModel whole(c, 4);
  const LlamaModel shared(c, 4, ModelPartition{.ep_rank = 1, .ep_size = 2});
  EXPECT_FALSE(entry(whole, "model.layers.0.block_sparse_moe.experts.0.w1.weight").expert);
  EXPECT_TRUE(entry(shared, "model.layers.0.block_sparse_moe.experts.2.w2.weight").expert);
  EXPECT_FALSE(entry(shared, "model.layers.0.block_sparse_moe.gate.weight").expert);
  EXPECT_THROW(shared.parameter("model.layers.0.block_sparse_moe.experts.1.w1.weight"), std::out_of_range);
}

TEST(ModelSlice, RefusesPartitionsThatDoNotSplitTheConfig) {
  const ModelConfig c = tiny(false);
  auto message = [&](const ModelConfig& config, const ModelPartition& partition) -> std::string {
    try {
      ModelSlice slice(config, partition);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(message(c, {.tp_size = 4}),
            "model: tensor parallel degree 4 must divide num_kv_heads and ffn_hidden_size");
  EXPECT_EQ(message(c, {.ep_size = 2}), "model: expert parallelism of 2 needs a mixture of experts whose count it divides");
  EXPECT_EQ(message(c, {.first_layer = 1, .num_layers = 2}), "model: layer range outside the model");
  const ModelSlice slice(c, {.tp_rank = 1, .tp_size = 2, .first_layer = 1});
  EXPECT_EQ(slice.num_layers, 1);
  EXPECT_EQ(slice.heads, 1);
  EXPECT_EQ(slice.kv_heads, 1);
  EXPECT_EQ(slice.ffn, 6);
  EXPECT_EQ(slice.vocab_begin, 5);  // 11 ids split 5 + 6
  EXPECT_EQ(slice.vocab, 6);
}

// Interleaved 1F1B: stage 0 of pp 2 x vpp 2 over 4 layers holds chunks of layers 0
// and 2 (virtual stages 0 and 2), numbered 0 and 1 on the rank, under their global
// names; the chunks' ranges are checked like one range.
TEST(ModelSlice, ChunksHoldTheirLayersUnderTheirGlobalNames) {
  ModelConfig c = tiny(false);
  c.num_layers = 4;
  const ModelPartition partition{.chunks = {{0, 1}, {2, 1}}, .has_head = false};
  const LlamaModel model(c, 4, partition);
  EXPECT_EQ(model.num_chunks(), 2);
  EXPECT_EQ(model.num_layers(), 2);
  EXPECT_NO_THROW(model.parameter("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_NO_THROW(model.parameter("model.layers.2.mlp.down_proj.weight"));
  EXPECT_THROW(model.parameter("model.layers.1.self_attn.q_proj.weight"), std::out_of_range);
  EXPECT_THROW(model.parameter("model.layers.3.self_attn.q_proj.weight"), std::out_of_range);
  const ModelSlice slice(c, partition);
  EXPECT_EQ(slice.global_layer(0), 0);
  EXPECT_EQ(slice.global_layer(1), 2);
  EXPECT_EQ(slice.chunk_begin(1), 1);
  EXPECT_EQ(slice.chunk_begin(2), 2);
  EXPECT_THROW(ModelSlice(c, {.chunks = {{0, 1}, {3, 2}}}), std::invalid_argument);
  // Offload and Mixtral's experts run one chunk per stage.
  EXPECT_THROW(LlamaModel(c, 4, partition, 1, nullptr, {.max_tokens = 8, .offload = true}), std::invalid_argument);
}

// A slot carries one (micro-batch, chunk) pair, so it holds room for one chunk's
// layers: 4 slots of chunks of 1 layer take what 4 slots of a 1-layer stage take.
// Recomputation counts each chunk's layers from its first, so at most the smallest
// chunk's (all of them: every chunk's).
TEST(ModelSlice, ASlotHoldsOneChunksLayers) {
  ModelConfig c = tiny(false);
  c.num_layers = 4;
  const LlamaModel chunked(c, 4, ModelPartition{.chunks = {{0, 1}, {2, 1}}, .has_head = false}, 4);
  const LlamaModel one_layer(c, 4, ModelPartition{.num_layers = 1, .has_head = false}, 4);
  const LlamaModel two_layers(c, 4, ModelPartition{.num_layers = 2, .has_head = false}, 4);
  EXPECT_EQ(chunked.activation_bytes(), one_layer.activation_bytes());
  EXPECT_LT(chunked.activation_bytes(), two_layers.activation_bytes());
  const ModelPartition uneven{.chunks = {{0, 1}, {1, 2}}, .has_head = false};
  const LlamaModel recomputing(c, 4, uneven, 1, nullptr, {}, Device::CPU, DType::F32, nullptr,
                               {RecomputeMode::Full, 1});
  EXPECT_EQ(recomputing.recompute_layers(), 2);  // layer 0 of each chunk
  const LlamaModel all(c, 4, uneven, 1, nullptr, {}, Device::CPU, DType::F32, nullptr, {RecomputeMode::Full});
  EXPECT_EQ(all.recompute_layers(), 3);  // every layer of both chunks
  EXPECT_THROW(LlamaModel(c, 4, uneven, 1, nullptr, {}, Device::CPU, DType::F32, nullptr, {RecomputeMode::Full, 2}),
               std::invalid_argument);
}

// Mixed precision's bf16 copy is rounded again by every refresh unless the optimizer
// has just written it (compute_parameters_written) and nobody took the master weights
// since: a write through any view of them is never missed.
TEST(ComputeWeights, ARefreshSkipsOnlyRightAfterTheUpdateWroteTheCopy) {
  LlamaModel model(tiny(false), 4, ModelPartition{}, 1, nullptr, {}, Device::CPU, DType::BF16);
  model.init_weights(3);
  const int64_t n = model.flat_parameters().numel();
  auto copy_equals_master_rounded = [&] {
    const Tensor master = model.flat_parameters(), compute = model.compute_parameters();
    for (int64_t i = 0; i < n; ++i)
      if (compute.bf16_data()[i].bits != to_bf16(master.data[i]).bits) return false;
    return true;
  };
  EXPECT_TRUE(copy_equals_master_rounded());  // init_weights refreshed
  // The update's protocol: take the master weights, write both, say so.
  Tensor master = model.flat_parameters();
  for (int64_t i = 0; i < n; ++i) {
    master.data[i] += 0.5f;
    model.compute_parameters().bf16_data()[i] = to_bf16(master.data[i]);
  }
  model.compute_parameters_written();
  // Skipped now (what the copy holds stays, even where it is not the rounding).
  model.compute_parameters().bf16_data()[0] = to_bf16(123.0f);
  model.refresh_compute_weights();
  EXPECT_EQ(model.compute_parameters().bf16_data()[0].bits, to_bf16(123.0f).bits);
  // A view of the master weights handed out since (a checkpoint load writes through
  // one): the refresh rounds again, the whole buffer or one parameter's view alike.
  model.compute_parameters_written();
  model.flat_parameters().data[1] = 7.0f;
  model.refresh_compute_weights();
  EXPECT_TRUE(copy_equals_master_rounded());
  model.compute_parameters_written();
  model.parameter_tensor(model.parameters().back()).data[0] = -3.0f;
  model.refresh_compute_weights();
  EXPECT_TRUE(copy_equals_master_rounded());
}

}  // namespace
}  // namespace hdp
