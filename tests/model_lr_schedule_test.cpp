// The learning rate of a step (linear warmup, then cosine decay to min_lr) and the
// gradient clipping factor, against values worked out by hand.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "model/lr_schedule.h"

namespace hdp {
namespace {

TEST(LearningRate, WarmsUpLinearlyThenDecaysByCosineToMinLr) {
  const LearningRateSchedule s{.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10};
  EXPECT_DOUBLE_EQ(learning_rate(s, 1, 110), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 5, 110), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(s, 10, 110), 1e-3);
  // Half way through the 100 decay steps: min_lr + (lr - min_lr) / 2.
  EXPECT_NEAR(learning_rate(s, 60, 110), 5.5e-4, 1e-15);
  EXPECT_NEAR(learning_rate(s, 110, 110), 1e-4, 1e-15);
  EXPECT_NEAR(learning_rate(s, 500, 110), 1e-4, 1e-15);  // past the end it stays at min_lr
  // No decay steps: lr after the warmup.
  EXPECT_DOUBLE_EQ(learning_rate(s, 12, 10), 1e-3);
  // No warmup: lr at the first step of the decay.
  const LearningRateSchedule flat{.lr = 2e-3, .min_lr = 0, .warmup_steps = 0};
  EXPECT_NEAR(learning_rate(flat, 0, 100), 2e-3, 1e-15);
}

TEST(LearningRate, TheConfigsOptimSectionIsTheSchedule) {
  OptimConfig optim;
  optim.lr = 4e-3;
  optim.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate(optim, 1, 100), 1e-3);
}

TEST(ClipFactor, ScalesTheNormDownToTheThresholdOnly) {
  EXPECT_FLOAT_EQ(clip_factor(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_factor(1.0, 1.0), 1.0f);
  EXPECT_EQ(clip_factor(100.0, 0.0), 1.0f);  // 0 disables clipping
  EXPECT_EQ(clip_factor(std::numeric_limits<double>::quiet_NaN(), 1.0), 1.0f);
}

}  // namespace
}  // namespace hdp
