// Sequence parallelism (parallel.sequence_parallel) in whole training runs: under
// tp 2 alone, with pipeline stages, with hybrid data parallelism, with long
// documents over rings (offload off: sequence parallelism refuses it), with
// activation recomputation and in bf16, the losses and gradient norms of 5 steps
// equal the same layout without sequence parallelism within 1e-5 relative (the norm
// weights' gradients change the order of sums, nothing else; measured: within 2e-9
// in fp32), and each rank saves less activation memory.
// tests/model_sequence_parallel_test.cpp shows the same of the gradients themselves.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
  std::string extra;   // the layout's other settings
  bool rings = false;  // long documents over rings of hdp ranks
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

// A 5-step run of `l` in `dir`, with `settings` after the layout's own; its output.
std::string train(const std::string& dir, const Layout& l, const std::string& settings) {
  return train_five_steps(dir, l.tp, l.pp, l.hdp, l.extra + " " + settings, l.name);
}

class SequenceParallelLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(SequenceParallelLayouts, EqualTheSameLayoutWithoutItWithin1e5) {
  const Layout& l = GetParam();
  const std::string plain_dir = scratch_dir("sp-" + l.name + "-off"), dir = scratch_dir("sp-" + l.name);
  train(plain_dir, l, "");
  const std::string output = train(dir, l, "--set parallel.sequence_parallel=true");
  for (const std::string key : {"loss", "grad_norm"}) {
    const std::vector<double> want = metric_values(plain_dir, key), got = metric_values(dir, key);
    ASSERT_EQ(want.size(), 5u) << l.name << " " << key;
    ASSERT_EQ(got.size(), 5u) << l.name << " " << key;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << l.name << " " << key << " step " << i + 1;
  }
  EXPECT_NE(output.find("sequence parallel: the norms' and residual stream's for 1/tp of the tokens"),
            std::string::npos)
      << output;
  const std::vector<double> peak_plain = metric_values(plain_dir, "activation_peak_bytes"),
                            peak = metric_values(dir, "activation_peak_bytes");
  EXPECT_LT(*std::max_element(peak.begin(), peak.end()), *std::max_element(peak_plain.begin(), peak_plain.end()))
      << l.name;
  if (l.rings) {
    const std::vector<double> ring_bytes = metric_values(dir, "attention_bytes");
    EXPECT_GT(*std::max_element(ring_bytes.begin(), ring_bytes.end()), 0) << l.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SequenceParallelLayouts,
    ::testing::Values(Layout{"tp2", 2, 1, 1, ""}, Layout{"tp2_pp2", 2, 2, 1, ""}, Layout{"tp2_hdp2", 2, 1, 2, ""},
                      // Documents up to 1024 tokens over rings of the two hdp ranks, 512 tokens each.
                      Layout{"tp2_hdp2_rings", 2, 1, 2,
                             "--set data.path=" + long_corpus() +
                                 " --set data.max_seq_len=1024 --set data.global_batch_tokens=2048"
                                 " --set data.micro_batch_tokens=512 --set offload.enabled=false",
                             true},
                      Layout{"tp2_full_recompute", 2, 1, 1, "--set train.recompute=full"},
                      Layout{"bf16_tp2", 2, 1, 1, "--set train.precision=bf16"}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

}  // namespace
}  // namespace hdp
