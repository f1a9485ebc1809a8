// Sequence parallelism (ModelPartition::sequence_parallel, Korthikanti et al. 2022)
// over an in-process tp group of threads: each rank's loss and gradients equal tp
// without sequence parallelism within 1e-5, for micro-batches whose tokens do and do
// not divide by tp (padding rows), over two pipeline stages driven by hand (the
// activations and gradients between them are a shard's rows), and under activation
// recomputation, which under sequence parallelism reruns the same kernels and
// collectives and so gives its gradients bit for bit; the arena holds the formula's
// bytes per token and layer (spec/model_shape.h); bad partitions are refused.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/model.h"
#include "small_model.h"
#include "test_util.h"
#include "thread_communicator.h"

namespace hdp {
namespace {

using testing::random_documents;
using testing::run_ranks;
using testing::ThreadCommunicator;

struct Batch {
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  MicroBatchView view() const { return MicroBatchView{tokens, targets, positions, cu_seqlens}; }
};

std::vector<float> to_host(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  copy(Tensor(out.data(), {t.numel()}, Device::CPU), t.view({t.numel()}));
  return out;
}


// Two micro-batches' losses and this rank's gradients (forward_backward twice,
// adding into the gradients), for `lengths` documents per micro-batch.
struct TrainingResult {
  std::vector<double> losses;
  std::vector<float> gradients;
  int64_t collectives = 0;  // on the tp group
};

TrainingResult run_one_stage(ThreadCommunicator& tp, bool sequence_parallel, const std::vector<int>& lengths,
                             const RecomputeOptions& recompute = {}) {
  ModelPartition part;
  part.tp_rank = tp.rank();
  part.tp_size = tp.size();
  part.sequence_parallel = sequence_parallel;
  LlamaModel model(testing::small_model_config(), 256, part, 1, &tp, {}, Device::CPU, DType::F32, nullptr, recompute);
  model.init_weights(11);
  model.zero_grad();
  tp.reset_stats();
  TrainingResult r;
  for (uint64_t seed : {5u, 6u}) {
    const Batch b = random_documents<Batch>(lengths, 61, seed);
    r.losses.push_back(model.forward_backward(b.view(), 1.0f / 100));
  }
  r.collectives = tp.stats().collectives;
  r.gradients = to_host(model.flat_gradients());
  return r;
}

// The same over two pipeline stages of two layers each on this rank, the stage
// boundary copied by hand as the pipeline executor sends it: gradients of stage 0,
// then of stage 1.
TrainingResult run_two_stages(ThreadCommunicator& tp, bool sequence_parallel, const std::vector<int>& lengths) {
  std::vector<std::unique_ptr<LlamaModel>> stages;
  for (int stage = 0; stage < 2; ++stage) {
    ModelPartition part;
    part.tp_rank = tp.rank();
    part.tp_size = tp.size();
    part.sequence_parallel = sequence_parallel;
    part.first_layer = 2 * stage;
    part.num_layers = 2;
    part.has_embedding = stage == 0;
    part.has_head = stage == 1;
    stages.push_back(std::make_unique<LlamaModel>(testing::small_model_config(), 256, part, 1, &tp));
    stages.back()->init_weights(11);
    stages.back()->zero_grad();
  }
  TrainingResult r;
  for (uint64_t seed : {5u, 6u}) {
    const Batch b = random_documents<Batch>(lengths, 61, seed);
    const int64_t T = static_cast<int64_t>(b.tokens.size());
    for (auto& stage : stages) stage->set_batch(0, b.view());
    EXPECT_EQ(stages[0]->output_activation(0).dim(0), stages[0]->residual_rows(T));
    // The first stage holds no head: no loss, and nothing launched for one.
    EXPECT_FALSE(stages[0]->forward(0, 1.0f / 100).has_value());
    copy(stages[1]->input_activation(0), stages[0]->output_activation(0));
    r.losses.push_back(read_back(stages[1]->forward(0, 1.0f / 100).value())[0]);
    stages[1]->backward(0);
    copy(stages[0]->output_gradient(0), stages[1]->input_gradient(0));
    stages[0]->backward(0);
  }
  for (auto& stage : stages) {
    const std::vector<float> g = to_host(stage->flat_gradients());
    r.gradients.insert(r.gradients.end(), g.begin(), g.end());
  }
  return r;
}

// Losses within 1e-5 relative; every gradient within 1e-5 of the largest one's
// magnitude (the sums over ranks and rows run in another order).
void expect_close(const TrainingResult& got, const TrainingResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << what << " loss " << i;
  ASSERT_EQ(got.gradients.size(), want.gradients.size()) << what;
  float scale = 0;
  for (float g : want.gradients) scale = std::max(scale, std::abs(g));
  ASSERT_GT(scale, 0.0f) << what;
  int far = 0;
  for (size_t i = 0; i < want.gradients.size(); ++i)
    far += std::abs(got.gradients[i] - want.gradients[i]) > 1e-5f * scale;
  EXPECT_EQ(far, 0) << what << ": gradients further than 1e-5 x " << scale;
}

// 192 tokens divide by 2; 191 leave rank 1 a padding row; 3 tokens a shard of 2 rows.
const std::vector<std::vector<int>> kLengths = {{120, 50, 22}, {120, 50, 21}, {3}};

TEST(SequenceParallel, EqualsTensorParallelismWithoutIt) {
  run_ranks(2, [](ThreadCommunicator& tp) {
    for (const std::vector<int>& lengths : kLengths) {
      const std::string what = "rank " + std::to_string(tp.rank()) + ", " + std::to_string(lengths.back());
      const TrainingResult sp = run_one_stage(tp, true, lengths), plain = run_one_stage(tp, false, lengths);
      expect_close(sp, plain, what);
      // Per micro-batch: each entry and exit (the embedding's, a layer's two of
      // each, the head's) collects in forward and backward where f and g do once;
      // each layer gathers its two norm outputs again in backward, and the norm
      // weights' gradients (two a layer and the final norm's) are summed.
      EXPECT_EQ(sp.collectives - plain.collectives, 2 * ((1 + 4 * 4 + 1) + 4 * 2 + (4 * 2 + 1))) << what;
    }
  });
}

TEST(SequenceParallel, OverTwoPipelineStagesEqualsTensorParallelismWithoutIt) {
  run_ranks(2, [](ThreadCommunicator& tp) {
    for (const std::vector<int>& lengths : kLengths) {
      const std::string what = "rank " + std::to_string(tp.rank()) + ", " + std::to_string(lengths.back());
      expect_close(run_two_stages(tp, true, lengths), run_two_stages(tp, false, lengths), what);
    }
  });
}

// Recomputation under sequence parallelism reruns the same kernels and the same
// all-gathers and reduce-scatters on the same inputs: bit for bit.
TEST(SequenceParallel, WithRecomputationGivesTheSameGradientsBitForBit) {
  run_ranks(2, [](ThreadCommunicator& tp) {
    const std::vector<int>& lengths = kLengths[1];
    const TrainingResult want = run_one_stage(tp, true, lengths);
    for (const RecomputeMode mode : {RecomputeMode::Selective, RecomputeMode::Full}) {
      const TrainingResult got = run_one_stage(tp, true, lengths, {mode, std::nullopt});
      EXPECT_EQ(got.losses, want.losses) << enum_name(kRecomputeModeNames, mode);
      EXPECT_EQ(got.gradients, want.gradients) << enum_name(kRecomputeModeNames, mode);
    }
  });
}

// Each layer's block holds what spec/model_shape.h's saved_bytes_per_token says
// with sequence parallelism: the norms' and the residual stream's tensors for half
// of the 192 tokens, in each mode and precision; less than without it.
TEST(SequenceParallelMemory, TheArenaHoldsTheFormulasBytesPerTokenAndLayer) {
  const ModelConfig c = testing::small_model_config();
  const int64_t T = 192;  // 96 rows a shard: every tensor fills whole 64-byte lines
  const Batch b = random_documents<Batch>({120, 50, 22}, 61, 4);
  run_ranks(2, [&](ThreadCommunicator& tp) {
    for (const DType precision : {DType::F32, DType::BF16}) {
      const int bytes = static_cast<int>(dtype_size(precision));
      for (const RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
        ModelPartition part;
        part.tp_rank = tp.rank();
        part.tp_size = 2;
        part.sequence_parallel = true;
        LlamaModel model(c, T, part, 1, &tp, {}, Device::CPU, precision, nullptr, {mode, std::nullopt});
        model.set_batch(0, b.view());
        const double measured =
            static_cast<double>(model.activation_usage().device_peak_bytes) / static_cast<double>(T * c.num_layers);
        const double formula = saved_bytes_per_token(c.shape(), 2, bytes, mode, false, true);
        const std::string what = std::string(enum_name(kRecomputeModeNames, mode)) + " " + dtype_name(precision);
        EXPECT_EQ(measured, formula) << what;
        EXPECT_EQ(model.saved_bytes_per_token(0), formula) << what;
        EXPECT_LT(formula, saved_bytes_per_token(c.shape(), 2, bytes, mode)) << what;
      }
    }
  });
  // The values (H 32, at tp 2: q 16, kv 8, F 24, 2 heads), fp32: without sequence
  // parallelism 4 (4 x 32 + 2 x 16 + 2 x 8 + 2 x 24) + 4 (2 + 2); with it the four
  // hidden-wide tensors and the two 1/rms are halved. Selective keeps x_in and x_mid
  // of them, full x_in alone.
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 2, 4, RecomputeMode::None), 4 * 224 + 4 * 4);
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 2, 4, RecomputeMode::None, false, true), 4 * (224 - 64) + 4 * 3);
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 2, 4, RecomputeMode::Selective, false, true), 4 * (160 - 32) + 4 * 2);
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 2, 4, RecomputeMode::Full, false, true), 4 * 16);
}

// Sequence parallelism needs a tp group to shard over and a dense model; offload,
// which moves the same rows of every saved tensor, is refused with it.
TEST(SequenceParallel, BadPartitionsAreRefused) {
  ModelConfig mixtral = testing::small_model_config();
  mixtral.arch = "mixtral";
  mixtral.num_experts = 4;
  mixtral.experts_per_token = 2;
  const ModelPartition alone{.sequence_parallel = true};
  EXPECT_NE(testing::thrown_message([&] { LlamaModel(testing::small_model_config(), 64, alone); }).find("sequence parallelism"),
            std::string::npos);
  const ModelPartition split{.tp_size = 2, .sequence_parallel = true};
  EXPECT_NE(testing::thrown_message([&] { LlamaModel(mixtral, 64, split); }).find("sequence parallelism"),
            std::string::npos);
  LongSequenceOptions offload;
  offload.offload = true;
  offload.max_tokens = 128;
  EXPECT_NE(testing::thrown_message([&] { LlamaModel(testing::small_model_config(), 64, split, 1, nullptr, offload); })
                .find("sequence parallelism"),
            std::string::npos);
}

}  // namespace
}  // namespace hdp
