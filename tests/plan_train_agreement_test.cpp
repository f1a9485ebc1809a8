// `trainer plan` and `trainer train` agree on layouts. For every shipped model file
// (configs/models/*.yaml) and a few cluster sizes, every tp x pp x ep the planner
// sets up (make_plan_setup, which `trainer plan` runs for the layout it is given and
// for each ep of expert_parallel_candidates it tries) is one the trainer's config
// checks accept, for the same model file under that layout; and every layout the
// trainer refuses, the planner refuses too, with the same rule (spec/model_checks.h).
// The planner may refuse more: a layout whose weights do not fit the GPUs' memory.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/model_file.h"
#include "trainer/plan_command.h"
#include "whatif/step_simulation.h"

namespace hdp {
namespace {

std::vector<std::string> model_files() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(HDP_SOURCE_DIR) + "/configs/models"))
    if (entry.path().extension() == ".yaml") paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<int> divisors_up_to(int n, int limit) {
  std::vector<int> d;
  for (int k = 1; k <= std::min(n, limit); ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

constexpr const char* kSource = "layout.yaml";

// The trainer's verdict on `model` under the layout, as `trainer train` reads a
// config (without the files): the ConfigError's "<key>: <problem>; <valid>" after
// its location, or nothing when it accepts.
std::optional<std::string> trainer_refusal(const ModelConfig& model, const ParallelDegrees& layout) {
  Config config;
  config.model = model;
  config.data.path = "data.h5";
  config.data.max_seq_len = 4096;
  config.data.micro_batch_tokens = 4096;
  config.data.global_batch_tokens = 4096 * static_cast<int64_t>(layout.hdp);
  static_cast<ParallelDegrees&>(config.parallel) = layout;
  try {
    parse_config_text(emit_config_yaml(config), kSource, {}, /*check_files=*/false);
    return std::nullopt;
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    const size_t key = message.find(": ", std::string(kSource).size() + 1);  // after "layout.yaml:LINE"
    return message.substr(key + 2);
  }
}

TEST(PlanTrainAgreement, EveryLayoutThePlannerSetsUpTheTrainerAccepts) {
  const HardwareProfile h100 = load_cluster_file(std::string(HDP_SOURCE_DIR) + "/configs/cluster/h100.yaml");
  const std::vector<std::string> files = model_files();
  ASSERT_GE(files.size(), 7u);
  int set_up = 0, refused_by_both = 0, refused_for_memory = 0;
  for (const std::string& path : files) {
    const ModelShape shape = load_model_file(path);  // what `trainer plan` plans with
    const ModelConfig model = read_model_file(path).model;  // what a training config holds
    int set_up_here = 0;
    for (int gpus : {8, 96, 512}) {
      for (int tp : divisors_up_to(gpus, 64)) {
        for (int pp : divisors_up_to(gpus / tp, 64)) {
          const int hdp = gpus / (tp * pp);
          const std::vector<int> candidates = expert_parallel_candidates(shape, hdp);
          for (int ep : {1, 2, 3, 4, 8}) {
            const ParallelDegrees layout{tp, pp, hdp, ep};
            const std::string what = path + " tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " hdp " +
                                     std::to_string(hdp) + " ep " + std::to_string(ep);
            const std::optional<std::string> refusal = trainer_refusal(model, layout);
            const bool candidate = std::find(candidates.begin(), candidates.end(), ep) != candidates.end();
            // The planner's enumeration of ep leaves out no layout the trainer takes.
            if (!refusal) EXPECT_TRUE(candidate) << what;
            try {
              make_plan_setup(h100, shape, gpus, tp, pp, 64 * 1024, 0, ep);
              ++set_up, ++set_up_here;
              EXPECT_FALSE(refusal.has_value())
                  << what << ": the planner sets it up, the trainer refuses: " << *refusal;
            } catch (const PlanInputError& e) {
              const std::string planner = e.what();
              if (refusal) {
                ++refused_by_both;
                EXPECT_NE(planner.find(*refusal), std::string::npos)
                    << what << ": refused by other rules\n  trainer: " << *refusal << "\n  planner: " << planner;
              } else {
                ++refused_for_memory;
                EXPECT_NE(planner.find("does not fit"), std::string::npos) << what << ": " << planner;
              }
            }
          }
        }
      }
    }
    EXPECT_GT(set_up_here, 0) << path << ": no layout set up";
  }
  // Each direction was exercised: layouts set up, refused by a rule (tp 16 over 8 KV
  // heads, ep 3 over 8 experts, ...) and refused for memory only.
  EXPECT_GT(set_up, 100);
  EXPECT_GT(refused_by_both, 100);
  EXPECT_GT(refused_for_memory, 10);
}

// The rule that used to differ: fewer KV heads than tp ranks. The planner once
// counted such a layout with replicated KV heads, which the model does not
// implement; both now refuse it with the one rule.
TEST(PlanTrainAgreement, FewerKvHeadsThanTpRanksIsRefusedByBoth) {
  const std::string path = std::string(HDP_SOURCE_DIR) + "/configs/models/llama-70b.yaml";
  const ModelConfig model = read_model_file(path).model;
  ASSERT_EQ(model.num_kv_heads, 8);
  const std::optional<std::string> refusal = trainer_refusal(model, ParallelDegrees{16, 1, 4, 1});
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->rfind("parallel.tp: 16 does not divide model.num_kv_heads 8; tensor parallelism splits the "
                           "key/value heads across ranks; choose a divisor of 8", 0),
            0u)
      << *refusal;
  const HardwareProfile h100 = load_cluster_file(std::string(HDP_SOURCE_DIR) + "/configs/cluster/h100.yaml");
  EXPECT_THROW(make_plan_setup(h100, load_model_file(path), 64, 16, 1, 64 * 1024), PlanInputError);
  EXPECT_NO_THROW(make_plan_setup(h100, load_model_file(path), 64, 8, 1, 64 * 1024));
  EXPECT_FALSE(trainer_refusal(model, ParallelDegrees{8, 1, 8, 1}).has_value());
}

}  // namespace
}  // namespace hdp
