// The whole model: loss and gradients against a naive double-precision reference
// differentiated numerically, and packing several documents into one micro-batch
// against running them one by one.

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/ops.h"
#include "reference_llama.h"
#include "test_util.h"
#include "model/model.h"

namespace hdp {
namespace {

using testing::random_documents;
using testing::ReferenceBatch;

ModelConfig tiny_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;  // grouped-query attention
  c.ffn_hidden_size = 12;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-5;
  c.tie_embeddings = tied;
  c.init_std = 0.35;  // large enough that every nonlinearity matters
  return c;
}

// Documents of lengths 4, 1 and 5 packed back to back (the 1-token document predicts nothing).
ReferenceBatch packed_batch() {
  ReferenceBatch b;
  const std::vector<std::vector<int32_t>> docs = {{3, 7, 1, 9}, {5}, {2, 2, 10, 0, 6}};
  b.cu_seqlens.push_back(0);
  for (const auto& doc : docs) {
    for (size_t i = 0; i < doc.size(); ++i) {
      b.tokens.push_back(doc[i]);
      b.targets.push_back(i + 1 < doc.size() ? doc[i + 1] : -1);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  return b;
}

MicroBatchView view(const ReferenceBatch& b) { return {b.tokens, b.targets, b.positions, b.cu_seqlens}; }

// LLaMA untied and tied, and tiny-mistral: a sliding window of 2 keys, shorter
// than the 4- and 5-token documents, so the window masks real pairs.
struct GradientCase {
  const char* name;
  bool tied;
  int64_t window;  // 0: none
  bool moe = false;  // Mixtral: 4 experts, top-2, a large aux coefficient so its gradient shows
};

ModelConfig gradient_config(const GradientCase& g) {
  ModelConfig c = tiny_config(g.tied);
  if (g.window > 0) {
    c.arch = "mistral";
    c.sliding_window = g.window;
  }
  if (g.moe) {
    c.arch = "mixtral";
    c.num_experts = 4;
    c.experts_per_token = 2;
    c.router_aux_loss_coef = 0.5;
  }
  return c;
}

class ModelGradient : public ::testing::TestWithParam<GradientCase> {};

TEST_P(ModelGradient, MatchesFiniteDifferencesOfNaiveReference) {
  const ModelConfig c = gradient_config(GetParam());
  LlamaModel model(c, 16);
  const ReferenceBatch batch = packed_batch();
  // Mixtral: the first seed from 7 whose routing keeps every token's k-th and (k+1)-th
  // router probabilities 1e-3 apart, so that no step of the finite differences below
  // (weights moved by 1e-4) flips a top-k choice, where the loss has a kink.
  uint64_t seed = 7;
  for (;; ++seed) {
    model.init_weights(seed);
    double margin = 0;
    testing::reference_loss(c, testing::weights_of(model), batch, &margin);
    if (!c.moe() || margin > 1e-3) break;
    ASSERT_LT(seed, 100u) << "no seed with a clear routing";
  }

  model.zero_grad();
  const double loss = model.forward_backward(view(batch), 1.0f);
  testing::Weights w = testing::weights_of(model);
  const double reference = testing::reference_loss(c, w, batch);
  if (c.moe()) EXPECT_GT(model.aux_loss(), 0.0);
  EXPECT_NEAR(loss, reference, 1e-5 * std::abs(reference));
  EXPECT_NEAR(model.forward_loss(view(batch)), reference, 1e-5 * std::abs(reference));

  // Central differences in double; the truncation error is O(h^2) ~ 1e-8.
  const double h = 1e-4;
  int64_t checked = 0;
  for (const ParameterInfo& p : model.parameters()) {
    const float* grad = model.flat_gradients().data + p.offset;
    double max_fd = 0;
    std::vector<double> fd(p.numel);
    for (int64_t i = 0; i < p.numel; ++i) {
      std::vector<double>& t = w[p.name];
      const double saved = t[i];
      t[i] = saved + h;
      const double up = testing::reference_loss(c, w, batch);
      t[i] = saved - h;
      const double down = testing::reference_loss(c, w, batch);
      t[i] = saved;
      fd[i] = (up - down) / (2 * h);
      max_fd = std::max(max_fd, std::abs(fd[i]));
    }
    for (int64_t i = 0; i < p.numel; ++i) {
      // fp32 forward/backward against a double reference: relative 1e-4 of the
      // tensor's largest gradient, plus 1e-3 of the element itself.
      ASSERT_NEAR(grad[i], fd[i], 1e-4 * max_fd + 1e-3 * std::abs(fd[i]) + 1e-7)
          << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, model.num_parameters());
}

INSTANTIATE_TEST_SUITE_P(Models, ModelGradient,
                         ::testing::Values(GradientCase{"untied", false, 0}, GradientCase{"tied", true, 0},
                                           GradientCase{"mistral_window2", false, 2},
                                           GradientCase{"mistral_window3_tied", true, 3},
                                           GradientCase{"mixtral", false, 0, true},
                                           GradientCase{"mixtral_window3", false, 3, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// The window really masks: with W = 2 the loss differs from full attention (the
// reference agrees with both), and a window as long as the longest document (5)
// is full attention exactly.
TEST(Model, SlidingWindowMasksOnlyKeysOutsideIt) {
  const ReferenceBatch batch = packed_batch();
  auto loss_with = [&](int64_t window, double* reference) {
    const ModelConfig c = gradient_config({"w", false, window});
    LlamaModel model(c, 16);
    model.init_weights(7);
    *reference = testing::reference_loss(c, testing::weights_of(model), batch);
    return model.forward_loss(view(batch));
  };
  double ref_full = 0, ref_2 = 0, ref_5 = 0, ref_1 = 0;
  const double full = loss_with(0, &ref_full), w2 = loss_with(2, &ref_2), w5 = loss_with(5, &ref_5);
  const double w1 = loss_with(1, &ref_1);
  EXPECT_NEAR(full, ref_full, 1e-5 * ref_full);
  EXPECT_NEAR(w2, ref_2, 1e-5 * ref_2);
  EXPECT_NEAR(w1, ref_1, 1e-5 * ref_1);
  EXPECT_EQ(w5, full);  // bit-identical: no key of a 5-token document is outside a window of 5
  EXPECT_GT(std::abs(w2 - full), 1e-3 * full);
  EXPECT_GT(std::abs(w1 - w2), 1e-3 * full);
}

TEST(Model, PackedMicroBatchEqualsDocumentsRunSeparately) {
  ModelConfig c = tiny_config(false);
  c.vocab_size = 37;
  c.hidden_size = 32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 40;
  c.init_std = 0.1;
  LlamaModel packed(c, 256), single(c, 256);
  packed.init_weights(3);
  single.init_weights(3);

  // Three documents long enough to span several attention tiles.
  std::vector<std::vector<int32_t>> docs(3);
  uint64_t state = 99;
  const int lengths[3] = {150, 7, 90};
  for (int dd = 0; dd < 3; ++dd)
    for (int i = 0; i < lengths[dd]; ++i) docs[dd].push_back(static_cast<int32_t>((state = state * 6364136223846793005ull + 1) >> 59) % 37);

  auto batch_of = [](const std::vector<const std::vector<int32_t>*>& ds) {
    ReferenceBatch b;
    b.cu_seqlens.push_back(0);
    for (const auto* doc : ds) {
      for (size_t i = 0; i < doc->size(); ++i) {
        b.tokens.push_back((*doc)[i]);
        b.targets.push_back(i + 1 < doc->size() ? (*doc)[i + 1] : -1);
        b.positions.push_back(static_cast<int32_t>(i));
      }
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    }
    return b;
  };

  packed.zero_grad();
  const double packed_loss = packed.forward_backward(view(batch_of({&docs[0], &docs[1], &docs[2]})), 0.01f);
  single.zero_grad();
  double single_loss = 0;
  for (const auto& doc : docs) single_loss += single.forward_backward(view(batch_of({&doc})), 0.01f);

  EXPECT_NEAR(packed_loss, single_loss, 1e-5 * single_loss);
  const Tensor g1 = packed.flat_gradients(), g2 = single.flat_gradients();
  double max_abs = 0;
  for (int64_t i = 0; i < g2.numel(); ++i) max_abs = std::max(max_abs, static_cast<double>(std::abs(g2.data[i])));
  ASSERT_GT(max_abs, 0.0);
  for (int64_t i = 0; i < g1.numel(); ++i) ASSERT_NEAR(g1.data[i], g2.data[i], 1e-5 * max_abs) << "gradient " << i;
}

TEST(Model, ParameterTableUsesHuggingFaceNamesAndShapes) {
  ModelConfig c = tiny_config(false);
  LlamaModel model(c, 8);
  EXPECT_EQ(model.parameters().front().name, "model.embed_tokens.weight");
  EXPECT_EQ(model.parameter("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(model.parameter("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(model.parameters().back().name, "lm_head.weight");
  // embed + 2 x (2 norms + q + k + v + o + gate + up + down) + norm + head
  EXPECT_EQ(model.num_parameters(), 88 + 2 * (16 + 64 + 32 + 32 + 64 + 96 * 3) + 8 + 88);
  LlamaModel tied(tiny_config(true), 8);
  EXPECT_EQ(tied.parameters().back().name, "model.norm.weight");
}

// Backward reports the final norm and head, each layer from the top down, then the
// embedding, each at the first flat offset of its parameters; every gradient from
// there on up is final when reported (ZeRO starts reducing it then).
class GradientsReadyOrder : public ::testing::TestWithParam<bool> {};

TEST_P(GradientsReadyOrder, ReportsEachPartWhereItsGradientsBeginOnceAllAboveAreFinal) {
  LlamaModel model(tiny_config(GetParam()), 16);
  model.init_weights(5);
  model.zero_grad();
  const Tensor grads = model.flat_gradients();
  std::vector<int64_t> offsets;
  std::vector<std::vector<float>> snapshots;
  model.forward_backward(view(packed_batch()), 1.0f, [&](int64_t offset) {
    offsets.push_back(offset);
    snapshots.emplace_back(grads.data, grads.data + grads.numel());
  });
  EXPECT_EQ(offsets, (std::vector<int64_t>{model.parameter("model.norm.weight").offset,
                                           model.parameter("model.layers.1.input_layernorm.weight").offset,
                                           model.parameter("model.layers.0.input_layernorm.weight").offset,
                                           model.parameter("model.embed_tokens.weight").offset}));
  EXPECT_EQ(offsets.back(), 0);
  for (size_t r = 0; r < offsets.size(); ++r) {
    for (int64_t i = offsets[r]; i < grads.numel(); ++i) {
      ASSERT_EQ(snapshots[r][static_cast<size_t>(i)], grads.data[i]) << "report " << r << ", gradient " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(UntiedAndTied, GradientsReadyOrder, ::testing::Values(false, true));


// The shape's counts (spec/model_shape.h) are those of the model that runs.
TEST(Model, ShapeCountsAreThoseOfTheModel) {
  for (bool tied : {false, true}) {
    const ModelShape shape = tiny_config(tied).shape();
    LlamaModel model(tiny_config(tied), 8);
    EXPECT_EQ(static_cast<double>(model.num_parameters()),
              2 * layer_parameters(shape) + embedding_parameters(shape) + head_parameters(shape, 1));
    const ActivationWidths w = activation_widths(shape, 1);
    EXPECT_EQ(w.row, 4 * 8 + 2 * 8 + 2 * 4 + 2 * 12);  // x, two norms, residual; q, attention; k, v; gate, up
    EXPECT_EQ(w.small, 2 + 2);                          // two 1/rms, the heads' log-sum-exp
    EXPECT_EQ(model.saved_floats_per_token(), w.row + w.small);
  }
  // MFU's FLOPs, sequences of 4, 1 and 5 tokens: per token and layer 6 x 480 matmul
  // parameters plus 6 x 8 qdim x (s + 1); the head 6 x 11 x 8.
  const std::vector<int64_t> lengths = {4, 1, 5};
  double expected = 0;
  for (int64_t s : lengths) expected += s * (2 * (6 * 480 + 48 * (s + 1)) + 528);
  EXPECT_EQ(training_flops(tiny_config(false).shape(), lengths), expected);

  // With a sliding window of 2 (Mistral) the documents have 3 + 2 x 2 = 7, 1 and
  // 3 + 3 x 2 = 9 visible (query, key) pairs instead of 10, 1 and 15; attention is
  // 6 x 2 x 8 = 96 FLOPs per pair and layer.
  EXPECT_EQ(attention_pairs(4, 2), 7);
  EXPECT_EQ(attention_pairs(1, 2), 1);
  EXPECT_EQ(attention_pairs(5, 2), 9);
  EXPECT_EQ(attention_pairs(5, 0), 15);
  EXPECT_EQ(attention_pairs(5, 5), 15);
  EXPECT_EQ(attention_pairs(4096, 1024), 1024.0 * 1025 / 2 + 3072.0 * 1024);
  const ModelShape windowed = gradient_config({"w", false, 2}).shape();
  EXPECT_EQ(windowed.window, 2);
  const double windowed_expected = 2 * (6 * 480 * 10 + 96 * (7 + 1 + 9)) + 528 * 10;
  EXPECT_NEAR(training_flops(windowed, lengths), windowed_expected, 1e-12 * windowed_expected);
  EXPECT_LT(training_flops(windowed, lengths), expected);
}

TEST(Model, InitIsDeterministicAndScaled) {
  ModelConfig c = tiny_config(false);
  c.hidden_size = 64;
  c.ffn_hidden_size = 256;
  c.num_layers = 8;
  c.init_std = 0.02;
  LlamaModel a(c, 8), b(c, 8);
  a.init_weights(5);
  b.init_weights(5);
  for (int64_t i = 0; i < a.flat_parameters().numel(); ++i) ASSERT_EQ(a.flat_parameters().data[i], b.flat_parameters().data[i]);
  auto stddev = [&](const std::string& name) {
    const ParameterInfo& p = a.parameter(name);
    double s = 0;
    for (int64_t i = 0; i < p.numel; ++i) s += std::pow(a.flat_parameters().data[p.offset + i], 2);
    return std::sqrt(s / static_cast<double>(p.numel));
  };
  EXPECT_NEAR(stddev("model.layers.0.mlp.up_proj.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("model.layers.0.mlp.down_proj.weight"), 0.02 / 4.0, 0.0005);  // 1/sqrt(2 * 8 layers)
  EXPECT_EQ(a.flat_parameters().data[a.parameter("model.norm.weight").offset], 1.0f);
}

}  // namespace
}  // namespace hdp

namespace hdp {
namespace {

ModelConfig offload_config() {
  ModelConfig c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.num_layers = 6;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.ffn_hidden_size = 48;
  c.init_std = 0.1;
  return c;
}

TEST(Offload, GradientsAreBitIdenticalAndTheDevicePeakFallsByTheOffloadedBytes) {
  const ModelConfig c = offload_config();
  LongSequenceOptions offload;
  offload.max_tokens = 512;
  offload.offload = true;
  LlamaModel plain(c, 256), offloaded(c, 256, {}, 1, nullptr, offload);
  plain.init_weights(9);
  offloaded.init_weights(9);
  // 192 tokens, half of them offloaded: 96-row halves keep every tensor 64-byte aligned.
  const ReferenceBatch b = random_documents<ReferenceBatch>({120, 50, 22}, 61, 4);
  MicroBatchView with = view(b), without = view(b);
  with.offload_ratio = 0.5;
  plain.zero_grad();
  offloaded.zero_grad();
  const double loss_plain = plain.forward_backward(without, 0.01f);
  offloaded.set_batch(0, with);
  const double loss_offloaded = read_back(offloaded.forward(0, 0.01f, true).value())[0];
  offloaded.backward(0);
  EXPECT_EQ(loss_plain, loss_offloaded);
  for (int64_t i = 0; i < plain.flat_gradients().numel(); ++i) {
    ASSERT_EQ(plain.flat_gradients().data[i], offloaded.flat_gradients().data[i]) << "gradient " << i;
  }
  // Per layer and token the row tensors hold x_in, ln1, x_mid, ln2 (H each), q and
  // attn (heads x d), k and v (kv heads x d), gate and up (ffn): layers 0..L-3 park
  // 96 rows of them in host memory.
  const int64_t row_floats = 4 * 32 + 2 * 32 + 2 * 16 + 2 * 48;
  const size_t offloaded_bytes = static_cast<size_t>(c.num_layers - 2) * 96 * row_floats * sizeof(float);
  EXPECT_EQ(plain.activation_usage().device_peak_bytes - offloaded.activation_usage().device_peak_bytes,
            offloaded_bytes);
  EXPECT_EQ(offloaded.activation_usage().host_peak_bytes, offloaded_bytes);
  EXPECT_EQ(offloaded.activation_usage().offloaded_bytes, static_cast<int64_t>(offloaded_bytes));
  EXPECT_GT(offloaded.activation_usage().host_pool_bytes, 0u);
}

TEST(Offload, AMicroBatchAboveTheCapacityRunsWithOffload) {
  const ModelConfig c = offload_config();
  LongSequenceOptions offload;
  offload.max_tokens = 384;
  offload.offload = true;
  // Capacity 256 tokens per layer; 384 tokens fit only with most of them offloaded.
  LlamaModel small(c, 256, {}, 1, nullptr, offload), large(c, 384);
  small.init_weights(2);
  large.init_weights(2);
  const ReferenceBatch b = random_documents<ReferenceBatch>({300, 84}, 61, 8);
  MicroBatchView v = view(b);
  EXPECT_THROW(small.forward_backward(v, 0.01f), std::invalid_argument);  // no room without offload
  v.offload_ratio = 0.75;
  small.zero_grad();
  large.zero_grad();
  small.set_batch(0, v);
  const double loss = read_back(small.forward(0, 0.01f, true).value())[0];
  small.backward(0);
  EXPECT_EQ(loss, large.forward_backward(view(b), 0.01f));
  for (int64_t i = 0; i < large.flat_gradients().numel(); ++i) {
    ASSERT_EQ(small.flat_gradients().data[i], large.flat_gradients().data[i]) << "gradient " << i;
  }
  EXPECT_LE(small.activation_usage().device_peak_bytes, small.activation_bytes());
}

}  // namespace
}  // namespace hdp
