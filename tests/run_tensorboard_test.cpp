// The step metrics as TensorBoard event files (run/tensorboard.h): every number of
// metrics.jsonl's line becomes a scalar of the same name, and the file holds the
// records a reader expects (file version first, a restart mark after a resume).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "run/tensorboard.h"
#include "test_util.h"

namespace hdp {
namespace {

StepMetrics sample_metrics() {
  StepMetrics m;
  m.step = 12;
  m.loss = 3.25;
  m.lr = 2e-4;
  m.grad_norm = 0.5;
  m.tokens = 1000;
  m.tokens_per_s = 4096;
  m.time = 1.7e9;
  m.mfu = 0.25;
  m.peak_mem_bytes = 1 << 20;
  m.busy_ms = {10, 12};
  m.planned_busy_ms = {11, 11};
  m.idle_fraction = 0.125;
  m.skipped_steps = 2;
  m.moe = true;
  m.expert_tokens = {5, 7, 9};
  return m;
}

std::map<std::string, float> by_tag(const std::vector<tfevents::Scalar>& scalars) {
  std::map<std::string, float> out;
  for (const auto& s : scalars) EXPECT_TRUE(out.emplace(s.tag, s.value).second) << "tag twice: " << s.tag;
  return out;
}

TEST(TensorBoardScalars, EveryKeyOfTheMetricsLineIsATag) {
  const StepMetrics m = sample_metrics();
  const std::map<std::string, float> tags = by_tag(tensorboard_scalars(m));
  const std::string line = to_json(m);
  const std::regex key("\"([a-z_]+)\": (\\[[^\\]]*\\]|[^,}]+)");
  int keys = 0;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), key); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1], value = (*it)[2];
    if (name == "step" || name == "time") continue;  // the event's own fields
    ++keys;
    if (value.front() == '[') {
      const std::string each = name == "expert_tokens" ? "/expert_" : "/rank_";
      EXPECT_TRUE(tags.count(name + each + "0")) << name;
    } else {
      ASSERT_TRUE(tags.count(name)) << name << " of " << line;
      EXPECT_FLOAT_EQ(tags.at(name), std::stof(value)) << name;
    }
  }
  EXPECT_GT(keys, 30);
  EXPECT_FLOAT_EQ(tags.at("busy_ms/rank_1"), 12);
  EXPECT_FLOAT_EQ(tags.at("planned_busy_ms/rank_0"), 11);
  EXPECT_FLOAT_EQ(tags.at("expert_tokens/expert_2"), 9);
  EXPECT_FALSE(tags.count("busy_ms/rank_2"));
}

// The file's records, the framing checked: length, its masked CRC, data, its masked CRC.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size());
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
    const std::string data = bytes.substr(at + 12, length);
    EXPECT_EQ(tfevents::record(data), bytes.substr(at, length + 16));
    records.push_back(data);
    at += length + 16;
  }
  return records;
}

TEST(TensorBoardWriter, StartsWithTheFileVersionAndMarksAResume) {
  const std::string dir = testing::scratch_dir("tensorboard-writer");
  std::string path;
  {
    TensorBoardWriter writer(dir, "host", /*resumed_step=*/11);
    path = writer.path();
    writer.write(sample_metrics());
  }
  EXPECT_EQ(std::filesystem::path(path).parent_path(), std::filesystem::path(dir) / "tensorboard");
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  const std::vector<std::string> records = read_records(path);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // wall_time (9 bytes), then step 12 (10 0c) and session_log { status: START } (3a 02 08 01).
  EXPECT_EQ(records[1].substr(9), std::string("\x10\x0c\x3a\x02\x08\x01", 6));
  const StepMetrics m = sample_metrics();
  EXPECT_EQ(records[2], tfevents::scalars_event(m.time, 12, tensorboard_scalars(m)));
}

}  // namespace
}  // namespace hdp
