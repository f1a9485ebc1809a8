// Activation recomputation (spec/model_shape.h, RecomputeMode) on one process: a
// recomputing model gives the loss and gradients of one that keeps everything, bit
// for bit, since the recomputed tensors come from the same kernels run in the same
// order on the same inputs (fp32 and bf16, the CPU and the guarded device, LLaMA,
// Mistral's window and Mixtral, some or all layers, offloaded layers beside
// recomputed ones, several micro-batches in flight); the arena holds what the
// formula says per token and layer; bad layer counts are refused.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/local_communicator.h"
#include "planning/plan.h"
#include "planning/ring_layout.h"
#include "small_model.h"
#include "test_util.h"

namespace hdp {
namespace {

using testing::random_documents;

struct Batch {
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  MicroBatchView view(double offload_ratio = 0) const {
    MicroBatchView v{tokens, targets, positions, cu_seqlens};
    v.offload_ratio = offload_ratio;
    return v;
  }
};

std::vector<float> to_host(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  copy(Tensor(out.data(), {t.numel()}, Device::CPU), t.view({t.numel()}));
  return out;
}

// 4 layers (so that layers 1 and 2 can offload beside a recomputed layer 0), GQA.
ModelConfig small_config(const std::string& arch) {
  ModelConfig c = testing::small_model_config();
  c.arch = arch;
  if (arch == "mistral") c.sliding_window = 16;
  if (arch == "mixtral") {
    c.num_experts = 4;
    c.experts_per_token = 2;
    c.router_aux_loss_coef = 0.5;
  }
  return c;
}

struct Case {
  std::string name, arch;
  DType precision;
  Device device;
  RecomputeMode mode;
  std::optional<int64_t> layers;  // nullopt: all
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Loss and gradients of two steps' micro-batches (two forward_backward calls adding
// into the gradients), of a model built with `recompute`.
struct TrainingResult {
  std::vector<double> losses;
  std::vector<float> gradients;
};
TrainingResult run(const Case& c, const RecomputeOptions& recompute) {
  LlamaModel model(small_config(c.arch), 256, {}, 1, nullptr, {}, c.device, c.precision, nullptr, recompute);
  model.init_weights(11);
  model.zero_grad();
  TrainingResult r;
  for (const Batch& b : {random_documents<Batch>({37, 1, 90, 13}, 61, 3), random_documents<Batch>({70, 70}, 61, 8)})
    r.losses.push_back(model.forward_backward(b.view(), 0.01f));
  r.gradients = to_host(model.flat_gradients());
  return r;
}

void expect_bit_equal(const TrainingResult& got, const TrainingResult& want, const std::string& what) {
  ASSERT_EQ(got.losses, want.losses) << what;
  ASSERT_EQ(got.gradients.size(), want.gradients.size()) << what;
  for (size_t i = 0; i < want.gradients.size(); ++i) ASSERT_EQ(got.gradients[i], want.gradients[i]) << what << " " << i;
}

class Recompute : public ::testing::TestWithParam<Case> {};

TEST_P(Recompute, GivesTheLossAndGradientsOfKeepingEverythingBitForBit) {
  const Case& c = GetParam();
  const TrainingResult want = run(c, {});
  const TrainingResult got = run(c, {c.mode, c.layers});
  expect_bit_equal(got, want, c.name);
  // Not vacuous: the gradients are not all zero.
  double sum = 0;
  for (float g : want.gradients) sum += std::fabs(g);
  EXPECT_GT(sum, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, Recompute,
    ::testing::Values(Case{"llama_full", "llama", DType::F32, Device::CPU, RecomputeMode::Full, std::nullopt},
                      Case{"llama_selective", "llama", DType::F32, Device::CPU, RecomputeMode::Selective, std::nullopt},
                      Case{"llama_full_2_layers", "llama", DType::F32, Device::CPU, RecomputeMode::Full, 2},
                      Case{"mistral_full", "mistral", DType::F32, Device::CPU, RecomputeMode::Full, std::nullopt},
                      Case{"mixtral_full", "mixtral", DType::F32, Device::CPU, RecomputeMode::Full, std::nullopt},
                      Case{"mixtral_selective", "mixtral", DType::F32, Device::CPU, RecomputeMode::Selective, 3},
                      Case{"bf16_full", "llama", DType::BF16, Device::CPU, RecomputeMode::Full, std::nullopt},
                      Case{"bf16_selective", "llama", DType::BF16, Device::CPU, RecomputeMode::Selective, 1},
                      Case{"guarded_full", "llama", DType::F32, Device::Guarded, RecomputeMode::Full, std::nullopt},
                      Case{"guarded_bf16_selective", "llama", DType::BF16, Device::Guarded, RecomputeMode::Selective,
                           std::nullopt}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Offload and recomputation per layer: layer 0 recomputes, layer 1 sends half its
// rows to host memory, layers 2 and 3 (the last two, whose backward comes at once)
// keep everything; against a model that does neither.
TEST(RecomputeWithOffload, RecomputedAndOffloadedLayersGiveThePlainGradientsBitForBit) {
  for (const RecomputeMode mode : {RecomputeMode::Full, RecomputeMode::Selective}) {
    for (const Device device : {Device::CPU, Device::Guarded}) {
      const ModelConfig c = small_config("llama");
      LongSequenceOptions offload;
      offload.max_tokens = 512;
      offload.offload = true;
      LlamaModel plain(c, 256, {}, 1, nullptr, {}, device);
      LlamaModel both(c, 256, {}, 1, nullptr, offload, device, DType::F32, nullptr, {mode, 1});
      plain.init_weights(9);
      both.init_weights(9);
      plain.zero_grad();
      both.zero_grad();
      // 192 tokens, half offloaded: 96-row halves keep every offloaded tensor 64-byte aligned.
      const Batch b = random_documents<Batch>({120, 50, 22}, 61, 4);
      const double loss_plain = plain.forward_backward(b.view(), 0.01f);
      both.set_batch(0, b.view(0.5));
      const double loss_both = read_back(both.forward(0, 0.01f, true).value())[0];
      both.backward(0);
      EXPECT_EQ(loss_plain, loss_both);
      // Only layer 1 went through host memory: its 96 rows of 320 saved values.
      const ActivationUsage& u = both.activation_usage();
      EXPECT_EQ(u.host_peak_bytes, 96u * 320 * 4);
      EXPECT_EQ(u.offloaded_bytes, 96 * 320 * 4);
      const std::vector<float> gp = to_host(plain.flat_gradients()), gb = to_host(both.flat_gradients());
      for (size_t i = 0; i < gp.size(); ++i) ASSERT_EQ(gp[i], gb[i]) << "gradient " << i;
    }
  }
}

// Pipeline schedules keep several micro-batches' forwards ahead of their backwards:
// the recomputed layers' shared block is rebuilt per backward, so two slots in
// flight (forward 0, forward 1, backward 0, backward 1, as 1F1B's warm-up runs them)
// give the plain model's results. A single stage without the head so that both
// forwards can run before the backwards (the output gradient is set by hand).
TEST(RecomputeWithSlots, TwoMicroBatchesInFlightGiveThePlainGradientsBitForBit) {
  const ModelConfig c = small_config("llama");
  ModelPartition body;
  body.has_head = false;
  auto run_slots = [&](const RecomputeOptions& recompute) {
    LlamaModel model(c, 256, body, 2, nullptr, {}, Device::CPU, DType::F32, nullptr, recompute);
    model.init_weights(5);
    model.zero_grad();
    const Batch a = random_documents<Batch>({37, 1, 90}, 61, 3), b = random_documents<Batch>({70, 50}, 61, 8);
    model.set_batch(0, a.view());
    model.forward(0, 1.0f);
    model.set_batch(1, b.view());
    model.forward(1, 1.0f);
    std::vector<float> outputs = to_host(model.output_activation(0));
    const std::vector<float> out1 = to_host(model.output_activation(1));
    outputs.insert(outputs.end(), out1.begin(), out1.end());
    for (int slot : {0, 1}) {
      const Tensor dout = model.output_gradient(slot);
      const std::vector<float> seed = testing::random_floats(static_cast<size_t>(dout.numel()), 17 + slot);
      copy(dout.view({dout.numel()}), Tensor(const_cast<float*>(seed.data()), {dout.numel()}, Device::CPU));
      model.backward(slot);
    }
    std::vector<float> grads = to_host(model.flat_gradients());
    grads.insert(grads.end(), outputs.begin(), outputs.end());
    return grads;
  };
  const std::vector<float> want = run_slots({});
  for (const RecomputeMode mode : {RecomputeMode::Full, RecomputeMode::Selective}) {
    const std::vector<float> got = run_slots({mode, std::nullopt});
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << enum_name(kRecomputeModeNames, mode) << i;
  }
}

// The arena's per-layer blocks hold, per token and layer, what the formula says
// (spec/model_shape.h, saved_bytes_per_token), in each mode and precision; and the
// whole arena shrinks by the difference times the layers, less the one shared block.
TEST(RecomputeMemory, TheArenaHoldsTheFormulasBytesPerTokenAndLayer) {
  const ModelConfig c = small_config("llama");
  const int64_t T = 192;  // a multiple of 16: every fp32 or bf16 tensor fills whole 64-byte lines
  const Batch b = random_documents<Batch>({120, 50, 22}, 61, 4);
  for (const DType precision : {DType::F32, DType::BF16}) {
    double previous = 1e30;
    for (const RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
      LlamaModel model(c, T, {}, 1, nullptr, {}, Device::CPU, precision, nullptr, {mode, std::nullopt});
      model.set_batch(0, b.view());
      const double measured =
          static_cast<double>(model.activation_usage().device_peak_bytes) / static_cast<double>(T * c.num_layers);
      const double formula = saved_bytes_per_token(c.shape(), 1, static_cast<int>(dtype_size(precision)), mode);
      EXPECT_EQ(measured, formula) << enum_name(kRecomputeModeNames, mode) << " " << dtype_name(precision);
      EXPECT_EQ(model.saved_bytes_per_token(0), formula);
      EXPECT_LT(static_cast<double>(model.activation_bytes()), previous) << enum_name(kRecomputeModeNames, mode);
      previous = static_cast<double>(model.activation_bytes());
    }
  }
  // The values themselves (H 32, q 32, kv 16, F 48, 4 heads), fp32:
  // none 4 (4 x 32 + 2 x 32 + 2 x 16 + 2 x 48) + 4 (2 + 4); selective drops both
  // norms and their 1/rms; full keeps the input.
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 1, 4, RecomputeMode::None), 4 * 320 + 4 * 6);
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 1, 4, RecomputeMode::Selective), 4 * 256 + 4 * 4);
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 1, 4, RecomputeMode::Full), 4 * 32);
  // A ring layer under full keeps its attention output and log-sum-exp too.
  EXPECT_EQ(saved_bytes_per_token(c.shape(), 1, 4, RecomputeMode::Full, true), 4 * (32 + 32) + 4 * 4);
}

// A micro-batch in a ring (rank 0 of a ring of 2 over one 384-token sequence: 192
// rows) under full recomputation: each layer's block holds the formula's ring bytes.
// Only laid out, not run (a ring of one process cannot exchange).
TEST(RecomputeMemory, ARingMicroBatchKeepsTheFormulasRingBytes) {
  const ModelConfig c = small_config("llama");
  LocalCommunicator ring_group("hdp", 0, 2);
  LongSequenceOptions rings;
  rings.hdp = &ring_group;
  const std::vector<int> peers = {0, 1};
  const std::vector<int64_t> lengths = {384};
  const RingLayout ring = zigzag_ring_layout(peers, lengths, 0);
  const int64_t T = ring.rows(0);
  ASSERT_EQ(T, 192);
  Batch b = random_documents<Batch>({static_cast<int>(T)}, 61, 4);
  b.cu_seqlens = {0};  // every row is a ring row
  b.targets.back() = 7;
  MicroBatchView view = b.view();
  view.ring = &ring;
  for (const DType precision : {DType::F32, DType::BF16}) {
    LlamaModel model(c, T, {}, 1, nullptr, rings, Device::CPU, precision, nullptr, {RecomputeMode::Full, std::nullopt});
    model.set_batch(0, view);
    const double measured =
        static_cast<double>(model.activation_usage().device_peak_bytes) / static_cast<double>(T * c.num_layers);
    const int bytes = static_cast<int>(dtype_size(precision));
    EXPECT_EQ(measured, saved_bytes_per_token(c.shape(), 1, bytes, RecomputeMode::Full, true)) << dtype_name(precision);
    EXPECT_GT(measured, saved_bytes_per_token(c.shape(), 1, bytes, RecomputeMode::Full));
    EXPECT_EQ(model.saved_bytes_per_token(0), measured);
  }
}

// Recomputation planned per micro-batch (RecomputeOptions::planned): each
// micro-batch's view says how many of the first layers recompute, beside its
// offload ratio. Micro-batches recomputing 0, 1 and 2 layers (one with half of layer
// 1's rows in host memory beside a recomputed layer 0, one offloading layers 0 and
// 1 without recomputation), one after another through the same slot, each give the
// loss and gradients of the model that keeps everything bit for bit, and of the
// model that recomputes the same count in every micro-batch (on the CPU, and on the
// guarded device, whose memory the host may touch only through ops, as a GPU's).
TEST(PlannedRecompute, EachMicroBatchsOwnCountGivesThePlainGradientsBitForBit) {
  struct Planned {
    int64_t recompute_layers;
    double offload_ratio;
  };
  const std::vector<Planned> mixes = {{0, 0}, {1, 0.5}, {2, 0}, {0, 0.5}, {1, 0}};
  const ModelConfig c = small_config("llama");
  LongSequenceOptions offload;
  offload.max_tokens = 512;
  offload.offload = true;
  const Batch b = random_documents<Batch>({120, 50, 22}, 61, 4);  // 192 tokens: 96-row halves stay aligned
  for (const auto& [mode, device] : {std::pair{RecomputeMode::Full, Device::CPU},
                                     std::pair{RecomputeMode::Selective, Device::CPU},
                                     std::pair{RecomputeMode::Full, Device::Guarded}}) {
    LlamaModel plain(c, 256, {}, 1, nullptr, {}, device);
    LlamaModel planned(c, 256, {}, 1, nullptr, offload, device, DType::F32, nullptr, {mode, 2, true});
    plain.init_weights(9);
    planned.init_weights(9);
    for (const Planned& m : mixes) {
      const std::string what = enum_name(kRecomputeModeNames, mode) + std::string(" ") + device_name(device) + " k " +
                               std::to_string(m.recompute_layers) + " r " + std::to_string(m.offload_ratio);
      LlamaModel fixed(c, 256, {}, 1, nullptr, offload, device, DType::F32, nullptr, {mode, m.recompute_layers});
      fixed.init_weights(9);
      for (LlamaModel* model : {&plain, &planned, &fixed}) model->zero_grad();
      MicroBatchView view = b.view(m.offload_ratio);
      const double loss_fixed = fixed.forward_backward(view, 0.01f);
      const double loss_plain = plain.forward_backward(b.view(), 0.01f);
      view.recompute_layers = m.recompute_layers;
      const double loss_planned = planned.forward_backward(view, 0.01f);
      EXPECT_EQ(loss_planned, loss_plain) << what;
      EXPECT_EQ(loss_planned, loss_fixed) << what;
      const std::vector<float> gp = to_host(plain.flat_gradients()), gm = to_host(planned.flat_gradients()),
                               gf = to_host(fixed.flat_gradients());
      for (size_t i = 0; i < gp.size(); ++i) {
        ASSERT_EQ(gm[i], gp[i]) << what << " gradient " << i;
        ASSERT_EQ(gm[i], gf[i]) << what << " gradient " << i;
      }
    }
    // Two micro-batches went through host memory, each half of its offloadable layers'
    // rows (2 layers without recomputation, 1 beside a recomputed layer).
    EXPECT_EQ(planned.activation_usage().offloaded_bytes, (2 + 1) * 96 * 320 * 4);
  }
}

// The arena holds the worst case the planners' memory limit admits (planning/plan.h,
// max_micro_batch_tokens with the arena's own rho): for every count of recomputed
// layers up to the most and every ratio, a micro-batch of the limit's tokens loads,
// with offload and without (recomputation alone then lets a micro-batch exceed the
// capacity). The host pool holds only what the largest offloading micro-batch
// without recomputation parks: one recomputing layers holds more tokens, but parks
// them from fewer layers.
TEST(PlannedRecompute, TheArenaHoldsEveryMixTheMemoryLimitAdmits) {
  const ModelConfig c = small_config("llama");
  const int64_t C = 128, L = c.num_layers;
  for (const auto& [mode, precision] : {std::pair{RecomputeMode::Full, DType::F32},
                                        std::pair{RecomputeMode::Selective, DType::F32},
                                        std::pair{RecomputeMode::Selective, DType::BF16}}) {
    const int bytes = static_cast<int>(dtype_size(precision));
    const double rho = saved_bytes_per_token(c.shape(), 1, bytes, mode) / saved_bytes_per_token(c.shape(), 1, bytes);
    for (const bool offload : {true, false}) {
      const std::vector<double> ratios = offload ? std::vector<double>{0, 0.25, 0.5, 1} : std::vector<double>{0};
      int64_t most = C;
      for (int64_t k = 0; k <= 3; ++k)
        for (double r : ratios) most = std::max(most, max_micro_batch_tokens(C, L, r, k, rho));
      LongSequenceOptions long_sequences;
      long_sequences.max_tokens = most;
      long_sequences.offload = offload;
      if (offload) long_sequences.offloaded_tokens = max_micro_batch_tokens(C, L, 1.0);
      LlamaModel model(c, C, {}, 1, nullptr, long_sequences, Device::CPU, precision, nullptr, {mode, 3, true});
      for (int64_t k = 0; k <= 3; ++k) {
        for (double r : ratios) {
          const int64_t T = max_micro_batch_tokens(C, L, r, k, rho);
          const Batch b = random_documents<Batch>({static_cast<int>(T)}, 61, 4);
          MicroBatchView view = b.view(r);
          view.recompute_layers = k;
          EXPECT_NO_THROW(model.set_batch(0, view))
              << enum_name(kRecomputeModeNames, mode) << " " << dtype_name(precision) << " k " << k << " r " << r;
        }
      }
      EXPECT_LE(model.activation_usage().device_peak_bytes, model.activation_bytes());
      if (!offload) continue;
      // The pool is an offload-only model's at its limit, (L - 2) of its blocks of
      // max_micro_batch_tokens(C, L, 1) rows, which the mix k = 0, r = 1 fills.
      LongSequenceOptions offload_only;
      offload_only.max_tokens = max_micro_batch_tokens(C, L, 1.0);
      offload_only.offload = true;
      const LlamaModel reference(c, C, {}, 1, nullptr, offload_only, Device::CPU, precision);
      const ActivationUsage& usage = model.activation_usage();
      EXPECT_EQ(usage.host_pool_bytes, reference.activation_usage().host_pool_bytes);
      EXPECT_EQ(usage.host_peak_bytes, usage.host_pool_bytes);
      // Full recomputation keeps so little that recomputing micro-batches exceed the
      // offload-only limit: the pool is below one for `most` tokens per layer.
      if (mode != RecomputeMode::Full) continue;
      EXPECT_GT(most, max_micro_batch_tokens(C, L, 1.0));
      long_sequences.offloaded_tokens = 0;
      const LlamaModel by_most(c, C, {}, 1, nullptr, long_sequences, Device::CPU, precision, nullptr, {mode, 3, true});
      EXPECT_LT(usage.host_pool_bytes, by_most.activation_usage().host_pool_bytes);
      // A pool sized for fewer tokens refuses the mix that parks more.
      long_sequences.offloaded_tokens = max_micro_batch_tokens(C, L, 1.0) - 1;
      LlamaModel short_pool(c, C, {}, 1, nullptr, long_sequences, Device::CPU, precision, nullptr, {mode, 3, true});
      const Batch largest = random_documents<Batch>({static_cast<int>(max_micro_batch_tokens(C, L, 1.0))}, 61, 4);
      EXPECT_NE(testing::thrown_message([&] { short_pool.set_batch(0, largest.view(1.0)); }).find("host pool"),
                std::string::npos);
    }
  }
  // A count above the most, or one for a model that does not plan per micro-batch: refused.
  LlamaModel planned(c, C, {}, 1, nullptr, {}, Device::CPU, DType::F32, nullptr, {RecomputeMode::Full, 2, true});
  LlamaModel fixed(c, C, {}, 1, nullptr, {}, Device::CPU, DType::F32, nullptr, {RecomputeMode::Full, 2});
  const Batch b = random_documents<Batch>({64}, 61, 4);
  MicroBatchView view = b.view();
  view.recompute_layers = 3;
  EXPECT_NE(testing::thrown_message([&] { planned.set_batch(0, view); }).find("at most 2"), std::string::npos);
  view.recompute_layers = 1;
  EXPECT_NE(testing::thrown_message([&] { fixed.set_batch(0, view); }).find("does not plan"), std::string::npos);
}

// A stage whose layers all recompute still reports a whole layer's bytes per token
// (the run's log prints both): spec/model_shape.h's, in the model's precision.
TEST(PlannedRecompute, AWholeLayersBytesPerTokenWhenEveryLayerRecomputes) {
  const ModelConfig c = small_config("llama");
  for (const DType precision : {DType::F32, DType::BF16}) {
    const LlamaModel model(c, 128, {}, 1, nullptr, {}, Device::CPU, precision, nullptr,
                           {RecomputeMode::Full, c.num_layers, true});
    const int bytes = static_cast<int>(dtype_size(precision));
    EXPECT_DOUBLE_EQ(model.whole_layer_bytes_per_token(), saved_bytes_per_token(c.shape(), 1, bytes));
    EXPECT_LT(model.saved_bytes_per_token(c.num_layers - 1), model.whole_layer_bytes_per_token());
  }
}

// recompute_layers above the stage's layers, or negative: refused.
TEST(RecomputeLayers, OutsideTheStagesLayersAreRefused) {
  const ModelConfig c = small_config("llama");
  for (int64_t n : {int64_t{5}, int64_t{-1}}) {
    const std::string message = testing::thrown_message(
        [&] { LlamaModel(c, 64, {}, 1, nullptr, {}, Device::CPU, DType::F32, nullptr, {RecomputeMode::Full, n}); });
    EXPECT_NE(message.find("recompute_layers " + std::to_string(n)), std::string::npos) << message;
  }
  ModelPartition stage;
  stage.first_layer = 2;
  stage.num_layers = 2;
  const std::string message = testing::thrown_message(
      [&] { LlamaModel(c, 64, stage, 1, nullptr, {}, Device::CPU, DType::F32, nullptr, {RecomputeMode::Full, 3}); });
  EXPECT_NE(message.find("outside [0, 2]"), std::string::npos) << message;
}

}  // namespace
}  // namespace hdp
