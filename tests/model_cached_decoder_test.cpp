// The key/value-cached decoder used by `trainer generate` against the model's own
// full forward: after every append, its logits of the last position equal the
// final norm and LM head applied to the full forward's hidden state at that
// position, for LLaMA (GQA, tied and untied), Mistral with a window shorter than the
// sequence, and Mixtral.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/ops.h"
#include "model/cached_decoder.h"
#include "model/model.h"

namespace hdp {
namespace {

struct DecoderCase {
  const char* name;
  const char* arch;
  bool tied;
  int64_t window;  // 0: none
};

ModelConfig decoder_config(const DecoderCase& dc) {
  ModelConfig c;
  c.arch = dc.arch;
  c.vocab_size = 37;
  c.hidden_size = 32;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 40;
  c.tie_embeddings = dc.tied;
  c.init_std = 0.2;
  if (dc.window > 0) c.sliding_window = dc.window;
  if (c.moe()) {
    c.num_experts = 4;
    c.experts_per_token = 2;
  }
  return c;
}

const std::vector<int32_t> kTokens = {3, 17, 1, 9, 30, 5, 5, 12, 0, 36, 21, 8, 2};

// Logits [T, V] of every position from one full forward of the model's layers
// (a headless copy of the same weights), then the final norm and the LM head.
std::vector<float> full_forward_logits(const LlamaModel& model) {
  const ModelConfig& c = model.config();
  const int64_t T = static_cast<int64_t>(kTokens.size()), H = c.hidden_size, V = c.vocab_size;
  ModelPartition headless;
  headless.has_head = false;
  LlamaModel layers(c, T, headless);
  for (const ParameterInfo& p : layers.parameters())
    copy(layers.parameter_tensor(p), model.parameter_tensor(model.parameter(p.name)));
  std::vector<int32_t> targets(T, -1), positions(T), cu_seqlens = {0, static_cast<int32_t>(T)};
  std::iota(positions.begin(), positions.end(), 0);
  layers.set_batch(0, MicroBatchView{kTokens, targets, positions, cu_seqlens});
  layers.forward(0, 1.0f, /*with_backward=*/false);
  std::vector<float> normed(T * H), rstd(T), logits(T * V);
  const ParameterInfo& head = model.parameter(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  rmsnorm_forward(Tensor(normed.data(), {T, H}), Tensor(rstd.data(), {T}), layers.output_activation(0),
                  model.parameter_tensor(model.parameter("model.norm.weight")), static_cast<float>(c.norm_eps));
  linear_forward(Tensor(logits.data(), {T, V}), Tensor(normed.data(), {T, H}),
                 model.parameter_tensor(head).view({V, H}));
  return logits;
}

// max |a - b| over the row, relative to the row's largest |b|.
double row_error(std::span<const float> a, const float* b, int64_t n) {
  double err = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return err / scale;
}

class CachedDecoderTest : public testing::TestWithParam<DecoderCase> {};

TEST_P(CachedDecoderTest, EveryPositionEqualsTheFullForward) {
  const ModelConfig c = decoder_config(GetParam());
  const int64_t T = static_cast<int64_t>(kTokens.size()), V = c.vocab_size;
  LlamaModel model(c, 1);
  model.init_weights(7);
  const std::vector<float> expected = full_forward_logits(model);

  CachedDecoder decoder(model, T);
  // A 5-token prompt at once, then one token at a time.
  const int64_t prompt = 5;
  std::span<const float> logits = decoder.append(std::span(kTokens).subspan(0, prompt));
  EXPECT_EQ(decoder.length(), prompt);
  EXPECT_LT(row_error(logits, &expected[(prompt - 1) * V], V), 2e-6) << "prompt";
  for (int64_t t = prompt; t < T; ++t) {
    logits = decoder.append(std::span(kTokens).subspan(t, 1));
    EXPECT_LT(row_error(logits, &expected[t * V], V), 2e-6) << "position " << t;
  }
  EXPECT_EQ(decoder.length(), T);
  // The cache is full: one more token is refused, and a cleared cache starts over.
  EXPECT_THROW(decoder.append(std::span(kTokens).subspan(0, 1)), std::length_error);
  decoder.clear();
  logits = decoder.append(std::span(kTokens).subspan(0, 3));
  EXPECT_LT(row_error(logits, &expected[2 * V], V), 2e-6) << "after clear";
}

INSTANTIATE_TEST_SUITE_P(Models, CachedDecoderTest,
                         testing::Values(DecoderCase{"llama_gqa", "llama", false, 0},
                                         DecoderCase{"llama_tied", "llama", true, 0},
                                         DecoderCase{"mistral_window4", "mistral", false, 4},
                                         DecoderCase{"mixtral", "mixtral", false, 0}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CachedDecoder, NeedsTheWholeModel) {
  const ModelConfig c = decoder_config({"llama", "llama", false, 0});
  ModelPartition headless;
  headless.has_head = false;
  LlamaModel layers(c, 1, headless);
  EXPECT_THROW(CachedDecoder(layers, 8), std::invalid_argument);
}

}  // namespace
}  // namespace hdp
