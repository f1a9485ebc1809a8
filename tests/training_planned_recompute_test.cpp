// Recomputation planned per micro-batch (train.recompute_per_micro_batch) in whole
// training runs: the step planner gives each micro-batch above the capacity its
// cheapest mix of recomputed layers and offload ratio (planning/activation_mix.h),
// the micro-batches within it recompute and offload nothing, and each activation
// slot recomputes its own micro-batch's count (model/activations.h).
//
// 6 layers, 256 tokens per rank and micro-batch, long documents: a ring member of
// 512 tokens holds l C / t = 3 layers' worth. With offload off only recomputation
// lets it fit (k rho + 6 - k <= 3: 4 of the 6 layers under full, which keeps the
// input and a ring layer's attention output, rho = 528 / 2840 bytes per token);
// with offload on at copies of 0.1 MB/s and train.recompute_layers 2 the planners
// recompute 2 layers and send r >= 0.69 of the next two layers' rows to the host.
// Both place the same micro-batches (every sequence above the capacity on the two
// ranks, whose members of at most 256 tokens cost nothing there), so they differ
// only in what recomputes and what is offloaded: bit for bit the same losses and
// gradient norms (the same kernels in the same order). Against the run that does
// neither and holds 512 tokens per micro-batch instead (sequences of 257 to 512
// tokens then sit whole on one rank beside others, so sums run in another order):
// equal within fp32 round-off, measured and bounded. A remote loader's plan carries
// the counts over its wire to the same results. The same under two pipeline
// stages of 3 layers (one rank per stage, sequences up to 512 tokens, 2 layers
// recomputing).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
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

const std::string kPlanned = " --set train.recompute=full --set train.recompute_per_micro_batch=true";

// The largest relative difference of `key` between two runs' 5 steps.
double largest_relative_difference(const std::string& dir, const std::string& other, const std::string& key) {
  const std::vector<double> got = metric_values(dir, key), want = metric_values(other, key);
  EXPECT_EQ(got.size(), 5u) << dir << " " << key;
  EXPECT_EQ(want.size(), 5u) << other << " " << key;
  double most = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    most = std::max(most, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
  return most;
}

double largest(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

TEST(PlannedRecompute, Hdp2RingsEqualTheRunWithoutRecomputationOrOffload) {
  const std::string data = " --set data.path=" + long_corpus() +
                           " --set model.num_layers=6 --set data.max_seq_len=1024 --set data.global_batch_tokens=2048";
  const std::string plain = scratch_dir("planned-recompute-hdp2-plain");
  const std::string alone = scratch_dir("planned-recompute-hdp2-alone");
  const std::string mixed = scratch_dir("planned-recompute-hdp2-mixed");
  train_five_steps(plain, 1, 1, 2, data + " --set data.micro_batch_tokens=512 --set offload.enabled=false", "plain");
  const std::string output =
      train_five_steps(alone, 1, 1, 2, data + kPlanned + " --set offload.enabled=false", "recomputation alone");
  train_five_steps(mixed, 1, 1, 2,
                   data + kPlanned + " --set train.recompute_layers=2 --set offload.bandwidth_gbs=0.0001",
                   "recomputation and offload");
  // The start-up report gives both sizes: 704 values of 4 bytes and 6 small ones per
  // token in a whole layer, 128 and 4 in a recomputed ring layer.
  EXPECT_NE(output.find("2840 bytes in a layer that keeps everything, 528 bytes in one that recomputes (full): up to "
                        "the first 6 layers"),
            std::string::npos)
      << output;
  // The plan crosses the remote loader's wire (one server, which also schedules):
  // each micro-batch's count arrives with it, or the long ones would not fit.
  const std::string remote = scratch_dir("planned-recompute-hdp2-remote");
  train_five_steps(remote, 1, 1, 2, data + kPlanned + " --set offload.enabled=false", "remote loader", 1);
  for (const std::string key : {"loss", "grad_norm"}) {
    const std::vector<double> got = metric_values(mixed, key);
    ASSERT_EQ(got.size(), 5u) << key;
    EXPECT_EQ(got, metric_values(alone, key)) << key;
    EXPECT_EQ(metric_values(remote, key), metric_values(alone, key)) << key;
    const double difference = largest_relative_difference(mixed, plain, key);
    std::printf("hdp 2 rings, %s: largest relative difference to the plain run %.3g\n", key.c_str(), difference);
    EXPECT_LT(difference, 1e-6) << key;
  }
  // The runs really ran as meant: recomputation is what lets the long documents fit
  // without offload (the same run recomputing nothing is refused: 1024 tokens need 4
  // ranks), they went through rings, and host memory only with offload.
  EXPECT_THROW(train_five_steps(scratch_dir("planned-recompute-hdp2-refused"), 1, 1, 2,
                                data + " --set train.recompute=full --set offload.enabled=false", "refused"),
               std::runtime_error);
  EXPECT_GT(largest(metric_values(alone, "attention_bytes")), 0);
  EXPECT_EQ(largest(metric_values(alone, "offloaded_bytes")), 0);
  EXPECT_GT(largest(metric_values(mixed, "offloaded_bytes")), 0);
}

TEST(PlannedRecompute, Pp2EqualsTheRunWithoutRecomputation) {
  const std::string data = " --set data.path=" + long_corpus() +
                           " --set model.num_layers=6 --set data.max_seq_len=512 --set data.global_batch_tokens=2048"
                           " --set offload.enabled=false";
  const std::string plain = scratch_dir("planned-recompute-pp2-plain");
  const std::string planned = scratch_dir("planned-recompute-pp2");
  train_five_steps(plain, 1, 2, 1, data + " --set data.micro_batch_tokens=512", "plain");
  train_five_steps(planned, 1, 2, 1, data + kPlanned, "planned recomputation");
  for (const std::string key : {"loss", "grad_norm"}) {
    const double difference = largest_relative_difference(planned, plain, key);
    std::printf("pp 2, %s: largest relative difference to the plain run %.3g\n", key.c_str(), difference);
    EXPECT_LT(difference, 1e-6) << key;
  }
}

}  // namespace
}  // namespace hdp
