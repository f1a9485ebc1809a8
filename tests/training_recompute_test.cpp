// Activation recomputation (train.recompute) in whole training runs under every
// kind of layout: tensor parallelism, pipeline stages, long documents over rings of
// hybrid-data-parallel ranks with offload beside the recomputed layers, Mixtral's
// expert parallelism and bf16. Each recomputing run gives the losses and gradient
// norms of the same layout without recomputation bit for bit: a recomputed layer
// reruns the same kernels, and the same collectives (tp's all-reduce of o's partial
// outputs), in the same order on the same inputs (tests/model_recompute_test.cpp
// shows the same of the gradients themselves on one process).

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"
#include "trainer_runs.h"

namespace hdp {
namespace {

using testing::long_corpus;
using testing::metric_values;
using testing::scratch_dir;
using testing::train_five_steps;

struct Layout {
  std::string name;
  int tp, pp, hdp;
  std::string extra;      // the layout's other settings
  std::string recompute;  // the train.recompute settings under test
  bool rings = false;     // long documents over rings, with offload (ring_settings)
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

// Rings of 2 over sequences up to 1024 tokens with 256 per rank and micro-batch,
// which needs offload: each rank holds 512 tokens.
std::string ring_settings() {
  return " --set data.path=" + long_corpus() +
         " --set data.max_seq_len=1024 --set data.global_batch_tokens=2048 --set offload.enabled=true";
}

// A 5-step run of `l` with `settings` in `dir`; its output.
std::string train(const std::string& dir, const Layout& l, const std::string& settings) {
  return train_five_steps(dir, l.tp, l.pp, l.hdp, l.extra + (l.rings ? ring_settings() : "") + " " + settings, l.name);
}

class RecomputeLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(RecomputeLayouts, EqualTheSameLayoutWithoutRecomputationBitForBit) {
  const Layout& l = GetParam();
  const std::string plain_dir = scratch_dir("recompute-" + l.name + "-none");
  const std::string dir = scratch_dir("recompute-" + l.name);
  train(plain_dir, l, "");
  const std::string output = train(dir, l, l.recompute);
  for (const std::string key : {"loss", "grad_norm"}) {
    const std::vector<double> want = metric_values(plain_dir, key), got = metric_values(dir, key);
    ASSERT_EQ(want.size(), 5u) << l.name << " " << key;
    EXPECT_EQ(got, want) << l.name << " " << key;
  }
  // The start-up report names the recomputing layers and what they keep.
  const std::string mode = l.recompute.find("full") != std::string::npos ? "full" : "selective";
  EXPECT_NE(output.find("layers that recompute (" + mode + ")"), std::string::npos) << output;
  // The layouts really ran as meant: less activation memory used, or (rings with
  // offload, where offload left little on the device) long documents through rings
  // and host memory.
  const std::vector<double> peak_plain = metric_values(plain_dir, "activation_peak_bytes"),
                            peak = metric_values(dir, "activation_peak_bytes");
  if (!l.rings) {
    EXPECT_LT(*std::max_element(peak.begin(), peak.end()), *std::max_element(peak_plain.begin(), peak_plain.end()))
        << l.name;
  } else {
    const std::vector<double> ring_bytes = metric_values(dir, "attention_bytes");
    EXPECT_GT(*std::max_element(ring_bytes.begin(), ring_bytes.end()), 0) << l.name;
    const std::vector<double> offloaded = metric_values(dir, "offloaded_bytes");
    EXPECT_GT(*std::max_element(offloaded.begin(), offloaded.end()), 0) << l.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RecomputeLayouts,
    ::testing::Values(
        Layout{"tp2_full", 2, 1, 1, "", "--set train.recompute=full"},
        Layout{"pp2_selective_1_layer", 1, 2, 1, "", "--set train.recompute=selective --set train.recompute_layers=1"},
        // 6 layers: layers 0 and 1 recompute (keeping their attention output and
        // log-sum-exp, as ring layers do; two, so that one overwrites the other's
        // shared tensors before its backward), layers 2 and 3 offload, layers 4 and
        // 5 keep everything.
        Layout{"hdp2_rings_offload_full_2_layers", 1, 1, 2, "--set model.num_layers=6",
               "--set train.recompute=full --set train.recompute_layers=2", true},
        Layout{"mixtral_hdp2_ep2_full", 1, 1, 2,
               "--set model.arch=mixtral --set model.num_experts=4 --set model.experts_per_token=2 "
               "--set model.router_aux_loss_coef=0.02 --set parallel.ep=2",
               "--set train.recompute=full"},
        Layout{"bf16_tp2_selective", 2, 1, 1, "--set train.precision=bf16", "--set train.recompute=selective"}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

}  // namespace
}  // namespace hdp
