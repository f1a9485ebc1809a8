// The learning rate of a step (linear warmup, then each schedule's decay to min_lr),
// whether a changed schedule continues a resumed run's, and the gradient clipping
// factor, against values worked out by hand.

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

TEST(LearningRate, CosineDecaysOverDecayStepsWhateverTheRunsLength) {
  const LearningRateSchedule s{.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .decay_steps = 50};
  EXPECT_EQ(lr_decay(s, 1000).start, 10);
  EXPECT_EQ(lr_decay(s, 1000).length, 50);
  EXPECT_DOUBLE_EQ(learning_rate(s, 10, 1000), 1e-3);
  EXPECT_NEAR(learning_rate(s, 35, 1000), 5.5e-4, 1e-15);  // half way: (lr + min_lr) / 2
  EXPECT_NEAR(learning_rate(s, 35, 40), 5.5e-4, 1e-15);    // the same in a shorter run
  EXPECT_NEAR(learning_rate(s, 60, 1000), 1e-4, 1e-15);
  EXPECT_NEAR(learning_rate(s, 900, 1000), 1e-4, 1e-15);  // after the decay: min_lr
}

TEST(LearningRate, LinearFallsInAStraightLine) {
  const LearningRateSchedule s{.kind = LrScheduleKind::Linear, .lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10};
  EXPECT_DOUBLE_EQ(learning_rate(s, 5, 110), 5e-4);        // warmup as for cosine
  EXPECT_NEAR(learning_rate(s, 35, 110), 7.75e-4, 1e-15);  // a quarter of 100 decay steps: 1e-4 + 9e-4 x 3/4
  EXPECT_NEAR(learning_rate(s, 60, 110), 5.5e-4, 1e-15);
  EXPECT_NEAR(learning_rate(s, 110, 110), 1e-4, 1e-15);
  const LearningRateSchedule to_zero{.kind = LrScheduleKind::Linear, .lr = 2e-3, .min_lr = 0, .warmup_steps = 0,
                                     .decay_steps = 40};
  EXPECT_NEAR(learning_rate(to_zero, 10, 1000), 1.5e-3, 1e-15);
  EXPECT_EQ(learning_rate(to_zero, 40, 1000), 0.0);
}

TEST(LearningRate, WsdHoldsLrThenDecaysLinearlyInTheLastPart) {
  // 100 steps, the last 20% decay: lr up to step 80, min_lr at step 100.
  const LearningRateSchedule s{.kind = LrScheduleKind::Wsd, .lr = 1e-3, .min_lr = 1e-5, .warmup_steps = 10,
                               .decay_fraction = 0.2};
  EXPECT_EQ(lr_decay(s, 100).start, 80);
  EXPECT_EQ(lr_decay(s, 100).length, 20);
  EXPECT_DOUBLE_EQ(learning_rate(s, 4, 100), 4e-4);
  EXPECT_EQ(learning_rate(s, 11, 100), 1e-3);
  EXPECT_EQ(learning_rate(s, 80, 100), 1e-3);
  EXPECT_NEAR(learning_rate(s, 90, 100), 5.05e-4, 1e-15);  // 1e-5 + (1e-3 - 1e-5) / 2
  EXPECT_NEAR(learning_rate(s, 100, 100), 1e-5, 1e-15);
  // Twice as long a run: still stable at step 90.
  EXPECT_EQ(learning_rate(s, 90, 200), 1e-3);
  // A decay of 30 steps given as such: from step 70.
  LearningRateSchedule steps = s;
  steps.decay_steps = 30;
  EXPECT_NEAR(learning_rate(steps, 85, 100), 5.05e-4, 1e-15);
  // A decay longer than the run after the warmup starts after the warmup.
  steps.decay_steps = 500;
  EXPECT_EQ(lr_decay(steps, 100).start, 10);
  EXPECT_EQ(lr_decay(steps, 100).length, 90);
  EXPECT_NEAR(learning_rate(steps, 55, 100), 5.05e-4, 1e-15);
}

TEST(LearningRate, ConstantStaysAtLrAfterTheWarmup) {
  const LearningRateSchedule s{.kind = LrScheduleKind::Constant, .lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 5};
  EXPECT_DOUBLE_EQ(learning_rate(s, 2, 100), 4e-4);
  EXPECT_EQ(learning_rate(s, 6, 100), 1e-3);
  EXPECT_EQ(learning_rate(s, 100, 100), 1e-3);
  EXPECT_EQ(learning_rate(s, 1000000, 100), 1e-3);
  EXPECT_EQ(lr_decay(s, 100).length, 0);
}

TEST(ScheduleContinues, OnlyWhenTheNextStepsRateIsTheSame) {
  const LearningRateSchedule cosine{.lr = 2e-3, .min_lr = 2e-4, .warmup_steps = 20};
  // The resume: 200 steps extended to 400 after step 100 restarts the decay.
  EXPECT_FALSE(schedule_continues({cosine, 200}, {cosine, 400}, 100));
  EXPECT_TRUE(schedule_continues({cosine, 200}, {cosine, 200}, 100));
  // Still warming up: the decay has not begun, so its length does not matter yet.
  EXPECT_TRUE(schedule_continues({cosine, 200}, {cosine, 400}, 10));
  // The old decay given as decay_steps continues it.
  LearningRateSchedule kept = cosine;
  kept.decay_steps = 180;
  EXPECT_TRUE(schedule_continues({cosine, 200}, {kept, 400}, 100));
  // wsd extended while stable continues; once decaying it does not.
  const LearningRateSchedule wsd{.kind = LrScheduleKind::Wsd, .lr = 1e-3, .min_lr = 0, .warmup_steps = 10,
                                 .decay_fraction = 0.1};
  EXPECT_TRUE(schedule_continues({wsd, 1000}, {wsd, 2000}, 500));
  EXPECT_FALSE(schedule_continues({wsd, 1000}, {wsd, 2000}, 950));
  // Another peak rate jumps.
  LearningRateSchedule lower = wsd;
  lower.lr = 5e-4;
  EXPECT_FALSE(schedule_continues({wsd, 1000}, {lower, 1000}, 500));
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
