// Progress lines' clock (base/progress_meter.h): durations as the lines say them,
// when a line is due, and the time left at the rate so far.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/progress_meter.h"

namespace hdp {
namespace {

TEST(FormatDuration, SecondsMinutesHours) {
  EXPECT_EQ(format_duration(0), "0 s");
  EXPECT_EQ(format_duration(8.4), "8 s");
  EXPECT_EQ(format_duration(59.4), "59 s");
  EXPECT_EQ(format_duration(125), "2 min 05 s");
  EXPECT_EQ(format_duration(3600 * 3 + 7 * 60 + 30), "3 h 07 min");
  EXPECT_EQ(format_duration(-3), "0 s");
}

TEST(ProgressMeter, DueOncePerIntervalAndTimeLeftAtTheRateSoFar) {
  ProgressMeter never(1e9);
  EXPECT_FALSE(never.due());
  ProgressMeter meter(0.05);
  EXPECT_FALSE(meter.due());
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_TRUE(meter.due());
  EXPECT_FALSE(meter.due());  // the interval starts again
  const double elapsed = meter.elapsed_s();
  EXPECT_GE(elapsed, 0.06);
  EXPECT_NEAR(meter.left_s(0.25), 3 * elapsed, 0.05);  // a quarter done: three times as long to go
  EXPECT_EQ(meter.left_s(1), 0);
  EXPECT_EQ(meter.left_s(0), 0);
  EXPECT_EQ(meter.elapsed_and_left(0), "0 s elapsed, ETA ?");
}

}  // namespace
}  // namespace hdp
