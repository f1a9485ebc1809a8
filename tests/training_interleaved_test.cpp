// Interleaved 1F1B (parallel.vpp: 2 model chunks per pipeline stage) in whole
// training runs under pp 2 alone and with hdp, tp, a micro-batch count that is not
// a multiple of the stages, long documents over rings, and recomputation. Each run
// gives the losses and gradient norms of the same layout with one chunk per stage
// bit for bit: every chunk runs the same kernels on the same inputs, and a
// parameter's gradient still sums its micro-batches in order (a chunk's backwards go
// through the micro-batches in order). Both are within 1e-5 relative of one process
// (measured: at most 5.4e-7, tp 2's gradient norm; 0 for pp 2 alone). Resuming
// across vpp 2 and vpp 1 continues like an uninterrupted run (checkpoints hold
// whole tensors by global layer).

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
using testing::run_command;
using testing::scratch_dir;
using testing::train_five_steps;

struct Layout {
  std::string name;
  int tp, pp, hdp;
  std::string data;  // the layout's data settings, which the one-process run shares
  std::string single_data = "";  // the one-process run's own (a micro-batch that holds a ring's sequence)
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

// Long documents (up to 1024 tokens) over rings of 2 hdp ranks: 512 tokens per rank
// and micro-batch, without offload (which the trainer refuses with vpp > 1).
const std::string kRings = " --set data.max_seq_len=1024 --set data.micro_batch_tokens=512"
                           " --set data.global_batch_tokens=2048 --set offload.enabled=false";

// Values of every step within `tolerance` relative.
void expect_near_run(const std::vector<double>& got, const std::vector<double>& want, double tolerance,
                     const std::string& what) {
  ASSERT_EQ(want.size(), 5u) << what;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tolerance * std::abs(want[i])) << what << " step " << i + 1;
}

class InterleavedLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(InterleavedLayouts, EqualOneChunkPerStageBitForBitAndOneProcess) {
  const Layout& l = GetParam();
  const std::string single_dir = scratch_dir("interleaved-" + l.name + "-single");
  const std::string plain_dir = scratch_dir("interleaved-" + l.name + "-vpp1");
  const std::string dir = scratch_dir("interleaved-" + l.name);
  train_five_steps(single_dir, 1, 1, 1, l.data + l.single_data, l.name + " one process");
  train_five_steps(plain_dir, l.tp, l.pp, l.hdp, l.data, l.name + " vpp 1");
  train_five_steps(dir, l.tp, l.pp, l.hdp, l.data + " --set parallel.vpp=2", l.name);
  for (const std::string key : {"loss", "grad_norm"}) {
    const std::vector<double> got = metric_values(dir, key);
    ASSERT_EQ(got.size(), 5u) << l.name << " " << key;
    EXPECT_EQ(got, metric_values(plain_dir, key)) << l.name << " " << key;
    expect_near_run(got, metric_values(single_dir, key), 1e-5, l.name + " against one process: " + key);
  }
  // The chunks really interleaved: each micro-batch's activations and gradients
  // crossed pp x vpp - 1 = 3 stage boundaries instead of pp - 1 = 1.
  const std::vector<double> pp_bytes = metric_values(dir, "pp_bytes"), plain_pp_bytes = metric_values(plain_dir, "pp_bytes");
  ASSERT_EQ(pp_bytes.size(), plain_pp_bytes.size()) << l.name;
  for (size_t i = 0; i < pp_bytes.size(); ++i) EXPECT_EQ(pp_bytes[i], 3 * plain_pp_bytes[i]) << l.name << " step " << i + 1;
  if (!l.single_data.empty()) {
    const std::vector<double> ring_bytes = metric_values(dir, "attention_bytes");
    EXPECT_GT(*std::max_element(ring_bytes.begin(), ring_bytes.end()), 0) << l.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, InterleavedLayouts,
    ::testing::Values(Layout{"pp2", 1, 2, 1, ""}, Layout{"pp2_hdp2", 1, 2, 2, ""}, Layout{"tp2_pp2", 2, 2, 1, ""},
                      // 768 tokens in micro-batches of 256: 3 per step, not a multiple of pp.
                      Layout{"pp2_three_micro_batches", 1, 2, 1, " --set data.global_batch_tokens=768"},
                      Layout{"pp2_hdp2_rings", 1, 2, 2, " --set data.path=" + long_corpus() + kRings,
                             " --set data.micro_batch_tokens=1024"},
                      // Every layer recomputes: the shared block of the recomputed
                      // tensors is rebuilt in backward whichever chunk ran last.
                      Layout{"pp2_recompute", 1, 2, 1, " --set train.recompute=full"}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// 768 tokens per step in micro-batches of 256 run 3 micro-batches per step: the
// schedule of pp 2 over 3 is the one of 4 with the fourth left out.
TEST(Interleaved, ThreeMicroBatchesPerStepRunAsSuch) {
  const std::string dir = scratch_dir("interleaved-three-micro-batches");
  train_five_steps(dir, 1, 2, 1, " --set data.global_batch_tokens=768 --set parallel.vpp=2", "three micro-batches");
  for (double m : metric_values(dir, "micro_batches")) EXPECT_EQ(m, 3);
}

// Steps 1-2 under pp 2 x vpp 2, 3-4 under pp 2 x vpp 1, 5 under vpp 2 again: the
// losses and gradient norms of the uninterrupted one-process run.
TEST(Interleaved, ResumingAcrossChunkCountsContinuesLikeAnUninterruptedRun) {
  // A warm-up longer than the run keeps the learning rate independent of train.steps.
  const std::string common = " --set optim.warmup_steps=10 --set train.keep_checkpoints=5 --set train.checkpoint_every=1";
  const std::string straight = scratch_dir("interleaved-resume-straight");
  train_five_steps(straight, 1, 1, 1, common, "uninterrupted");
  const std::string dir = scratch_dir("interleaved-resume");
  train_five_steps(dir, 1, 2, 1, common + " --set train.steps=2 --set parallel.vpp=2", "steps 1-2 (vpp 2)");
  const std::string resumed = train_five_steps(dir, 1, 2, 1, common + " --set train.steps=4", "steps 3-4 (vpp 1)");
  EXPECT_NE(resumed.find("resumed from"), std::string::npos) << resumed;
  train_five_steps(dir, 1, 2, 1, common + " --set parallel.vpp=2", "step 5 (vpp 2)");
  for (const std::string key : {"loss", "grad_norm"})
    expect_near_run(metric_values(dir, key), metric_values(straight, key), 1e-5, "resumed: " + key);
}

}  // namespace
}  // namespace hdp
