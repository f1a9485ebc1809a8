// `trainer plan` and what it reads: the built-in length distributions reproduce
// the published token-share statistics, global batches are cut at the context,
// lengths files and their errors, the cluster and model files (and their
// errors, naming file and key), the step's lower bound against every policy's
// simulated step, the search of a policy's setups (pruned by the bound, equal plans
// simulated once) against the exhaustive one, and the command end to end (exit codes, the table, the Chrome
// trace, Mixtral with its expert-parallel degree chosen, --recompute and
// --sequence-parallel, their capacities, and the stage boundaries' sends under
// sequence parallelism).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/errors.h"
#include "data/dataset.h"
#include "data/length_distributions.h"
#include "planning/pipeline_schedule.h"
#include "test_util.h"
#include "trainer/plan_command.h"

namespace hdp {
namespace {

using testing::run_trainer;
using testing::scratch_dir;

constexpr int64_t K = 1024, M = 1024 * 1024;

std::string config(const std::string& rel) { return std::string(HDP_SOURCE_DIR) + "/configs/" + rel; }

std::vector<int64_t> draw(const std::string& name, size_t n, uint64_t seed) {
  LengthSampler s(builtin_distribution(name), seed);
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = s.next();
  return v;
}

double fraction_at_least(const std::vector<int64_t>& v, int64_t t) {
  return static_cast<double>(std::count_if(v.begin(), v.end(), [&](int64_t x) { return x >= t; })) /
         static_cast<double>(v.size());
}

// ByteScale (Ge et al., 2025), its section on data heterogeneity (the Byted
// length distribution): about 80% of samples <= 4K; 0.05% reach 2M and
// carry 12.1% of tokens; the 1% at 128K or more carry 44.3%; 37% of tokens come
// from sequences over 256K.
TEST(LengthDistributions, BytedMatchesThePublishedStatistics) {
  for (uint64_t seed : {1u, 2u}) {
    const std::vector<int64_t> v = draw("byted", 4'000'000, seed);
    EXPECT_NEAR(fraction_at_most(v, 4 * K), 0.80, 0.002);
    EXPECT_NEAR(fraction_at_least(v, 2048 * K), 0.0005, 0.00005);
    EXPECT_NEAR(fraction_at_least(v, 128 * K), 0.01, 0.0003);
    EXPECT_NEAR(token_share_above(v, 2048 * K, true), 0.121, 0.008);
    EXPECT_NEAR(token_share_above(v, 128 * K, true), 0.443, 0.012);
    EXPECT_NEAR(token_share_above(v, 256 * K), 0.37, 0.012);
    EXPECT_EQ(*std::max_element(v.begin(), v.end()), 2048 * K);
    EXPECT_GE(*std::min_element(v.begin(), v.end()), 32);
  }
}

// GitHub code: over 128K carry 16.2% of tokens, over 256K 9.8%.
TEST(LengthDistributions, GithubMatchesThePublishedStatistics) {
  const std::vector<int64_t> v = draw("github", 4'000'000, 7);
  EXPECT_NEAR(token_share_above(v, 128 * K), 0.162, 0.012);
  EXPECT_NEAR(token_share_above(v, 256 * K), 0.098, 0.012);
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  EXPECT_NEAR(mean, 3000, 150);
}

TEST(LengthDistributions, SegmentExponentsGiveTheirMeans) {
  for (const std::string& name : builtin_distribution_names()) {
    const LengthSampler s(builtin_distribution(name), 1);
    const LengthDistribution& d = s.distribution();
    for (size_t k = 0; k < d.segments.size(); ++k) {
      const LengthSegment& seg = d.segments[k];
      if (seg.lo == seg.hi) continue;
      const double want = seg.token_share * d.mean_length / seg.probability;
      EXPECT_NEAR(power_law_mean(static_cast<double>(seg.lo), static_cast<double>(seg.hi), s.exponents()[k]), want,
                  1e-6 * want)
          << name << " segment " << k;
    }
  }
  EXPECT_NEAR(power_law_mean(1, 100, 1), 99 / std::log(100.0), 1e-9);
  EXPECT_NEAR(power_law_mean(1, 100, 2), std::log(100.0) / 0.99, 1e-9);
  EXPECT_NEAR(power_law_mean(1, 100, 0), 50.5, 1e-9);
  LengthDistribution bad = builtin_distribution("byted");
  bad.segments[0].probability = 0.7;  // probabilities no longer sum to 1
  EXPECT_THROW(LengthSampler(bad, 1), std::invalid_argument);
  EXPECT_THROW(builtin_distribution("pile"), LengthsInputError);
}

TEST(LengthDistributions, GlobalBatchesAreCutAtTheContext) {
  std::vector<int64_t> docs = {2500, 100, 5000};
  size_t i = 0;
  auto next = [&]() -> int64_t { return i < docs.size() ? docs[i++] : 0; };
  EXPECT_EQ(fill_global_batch(next, 1024, 1 << 20), (std::vector<int64_t>{1024, 1024, 452, 100, 1024, 1024, 1024, 1024, 904}));
  i = 0;
  // The first piece that would exceed the batch ends it.
  EXPECT_EQ(fill_global_batch(next, 1024, 2599), (std::vector<int64_t>{1024, 1024, 452}));
  for (int64_t context : {256 * K, 2 * M}) {
    const std::vector<int64_t> b = sample_global_batch(builtin_distribution("byted"), context, 32 * M, 3);
    const int64_t total = std::accumulate(b.begin(), b.end(), int64_t{0});
    EXPECT_LE(total, 32 * M);
    EXPECT_GT(total, 32 * M - context);
    EXPECT_EQ(*std::max_element(b.begin(), b.end()), context);  // the 2M documents are there, cut at the context
  }
  // Deterministic for a seed.
  EXPECT_EQ(sample_global_batch(builtin_distribution("github"), 64 * K, 4 * M, 9),
            sample_global_batch(builtin_distribution("github"), 64 * K, 4 * M, 9));
}

TEST(LengthDistributions, LengthsFiles) {
  const std::string dir = scratch_dir("plan_lengths");
  const std::string good = dir + "/good.txt", bad = dir + "/bad.txt";
  std::ofstream(good) << "# lengths\n3000\n\n  200  \n70000\n";
  std::ofstream(bad) << "100\n200\nabc\n";
  EXPECT_EQ(read_length_file(good), (std::vector<int64_t>{3000, 200, 70000}));
  try {
    read_length_file(bad);
    ADD_FAILURE() << "accepted a bad line";
  } catch (const LengthsInputError& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_length_file(dir + "/missing.txt"), LengthsInputError);
  // Through the command's source dispatch: in file order, cut at the context.
  EXPECT_EQ(global_batch_lengths(good, 32 * K, 1 << 30, 1), (std::vector<int64_t>{3000, 200, 32 * K, 32 * K, 70000 - 64 * K}));
  EXPECT_THROW(global_batch_lengths("no-such-distribution", 1024, 4096, 1), LengthsInputError);
}

// An HDF5 token dataset: the trainer sampler's first batch (shuffled documents cut at
// the context), here exactly the whole dataset.
TEST(LengthDistributions, DatasetGlobalBatch) {
  const std::string path = scratch_dir("plan_dataset") + "/docs.h5";
  const std::vector<int64_t> docs = {5000, 100, 3000, 70000};
  {
    TokenDatasetWriter w(path, 256, "bytes", 0, 1);
    for (int64_t n : docs) w.append(std::vector<uint32_t>(static_cast<size_t>(n), 7));
    w.finish();
  }
  std::string description;
  std::vector<int64_t> got = global_batch_lengths(path, 32 * K, 78100, 5, &description);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int64_t>{100, 3000, 70000 - 64 * K, 5000, 32 * K, 32 * K}));
  EXPECT_NE(description.find("HDF5"), std::string::npos);
}

TEST(PlanFiles, ClusterAndModelFilesLoad) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  EXPECT_EQ(h.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(h.peak_flops, 989.4e12);
  EXPECT_DOUBLE_EQ(h.internode_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(h.link_efficiency, 1);  // keys absent: peaks and the large-kernel rate
  EXPECT_DOUBLE_EQ(h.gemm_half_rows, 0);
  // The derated file: the same cluster with link and small-kernel efficiency.
  const HardwareProfile d = load_cluster_file(config("cluster/h100-derated.yaml"));
  EXPECT_DOUBLE_EQ(d.peak_flops, h.peak_flops);
  EXPECT_DOUBLE_EQ(d.internode_bytes_per_s, h.internode_bytes_per_s);
  EXPECT_DOUBLE_EQ(d.link_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(d.gemm_half_rows, 512);
  EXPECT_DOUBLE_EQ(d.attention_half_rows, 1024);
  for (const char* name : {"llama-7b", "llama-13b", "llama-30b", "llama-70b", "mistral-7b", "mistral-8x7b", "mistral-8x22b"}) {
    const ModelShape m = load_model_file(config(std::string("models/") + name + ".yaml"));
    EXPECT_EQ(m.name, name);
    EXPECT_EQ(m.vocab, std::string(name) == "mistral-8x22b" ? 32768 : 32000) << name;
    EXPECT_EQ(m.head_dim * m.heads, m.hidden) << name;
  }
  const ModelShape moe = load_model_file(config("models/mistral-8x22b.yaml"));
  EXPECT_EQ(moe.layers, 56);
  EXPECT_EQ(moe.hidden, 6144);
  EXPECT_EQ(moe.heads, 48);
  EXPECT_EQ(moe.ffn, 16384);
  EXPECT_EQ(moe.window, 0);
  EXPECT_EQ(moe.experts, 8);
  EXPECT_EQ(moe.experts_per_token, 2);
  const ModelShape big = load_model_file(config("models/llama-70b.yaml"));
  EXPECT_EQ(big.ffn, 28672);
  EXPECT_EQ(big.kv_heads, 8);
  const ModelShape mistral = load_model_file(config("models/mistral-7b.yaml"));
  EXPECT_EQ(mistral.window, 4096);
  EXPECT_EQ(mistral.ffn, 14336);
  EXPECT_EQ(big.window, 0);  // no key: full attention
}

void expect_plan_error(const std::string& path, bool cluster, const std::string& needle) {
  try {
    if (cluster) {
      load_cluster_file(path);
    } else {
      load_model_file(path);
    }
    ADD_FAILURE() << path << " was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

std::string h100_text() {
  std::ifstream in(config("cluster/h100.yaml"));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The 1-based line of `text` on which `needle` starts.
std::string line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  return std::to_string(1 + std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
}

TEST(PlanFiles, ErrorsNameFileAndKey) {
  const std::string dir = scratch_dir("plan_files");
  const std::string text = h100_text();
  const std::string extra = text + "nvlink_gbps: 900\n";
  std::ofstream(dir + "/extra.yaml") << extra;
  expect_plan_error(dir + "/extra.yaml", true,
                    "extra.yaml:" + line_of(extra, "nvlink_gbps:") +
                        ": nvlink_gbps: unknown key; valid keys: gpus_per_node");
  std::string missing = text;
  missing.erase(missing.find("pcie_bytes_per_s:"), std::string("pcie_bytes_per_s: 64.0e9").size());
  std::ofstream(dir + "/missing.yaml") << missing;
  expect_plan_error(dir + "/missing.yaml", true, "missing.yaml: pcie_bytes_per_s: required key is missing");
  std::string typed = text;
  typed.replace(typed.find("achievable_fraction: 0.5"), 24, "achievable_fraction: half");
  std::ofstream(dir + "/typed.yaml") << typed;
  expect_plan_error(dir + "/typed.yaml", true,
                    "typed.yaml:" + line_of(typed, "achievable_fraction:") +
                        ": achievable_fraction: expected a number, got 'half'");
  std::string range = text;
  range.replace(range.find("achievable_fraction: 0.5"), 24, "achievable_fraction: 1.5");
  std::ofstream(dir + "/range.yaml") << range;
  expect_plan_error(dir + "/range.yaml", true, "achievable_fraction");
  const std::string links = text + "link_efficiency: 1.25\n";
  std::ofstream(dir + "/links.yaml") << links;
  expect_plan_error(dir + "/links.yaml", true, "link_efficiency must be in (0, 1]");
  expect_plan_error(dir + "/absent.yaml", true, "cannot open the cluster file (No such file or directory)");
  // Model files are the training config's model section (read_model_file): its keys,
  // rules and messages, at the file's lines.
  const std::string sizes = "num_layers: 32\nhidden_size: 4096\nnum_heads: 32\nnum_kv_heads: 8\nvocab_size: 32000\n";
  std::ofstream(dir + "/model.yaml") << sizes << "ffn_hidden_size: 11008\nexperts: 8\n";
  expect_plan_error(dir + "/model.yaml", false,
                    "model.yaml:7: model.experts: unknown key in section 'model'; valid keys in model: arch, "
                    "vocab_size, hidden_size");
  std::ofstream(dir + "/model2.yaml") << "arch: mixtral\n" << sizes << "ffn_hidden_size: 11008\nnum_experts: 2\n"
                                         "experts_per_token: 4\n";
  expect_plan_error(dir + "/model2.yaml", false,
                    "model2.yaml:9: model.experts_per_token: 4 is outside [1, model.num_experts = 2]");
  std::ofstream(dir + "/dense.yaml") << sizes << "ffn_hidden_size: 11008\nnum_experts: 8\n";
  expect_plan_error(dir + "/dense.yaml", false,
                    "dense.yaml:7: model.num_experts: is for model.arch 'mixtral' only, and this model's is 'llama'");
  std::ofstream(dir + "/window.yaml") << "arch: mistral\n" << sizes << "ffn_hidden_size: 14336\nsliding_window: 0\n";
  expect_plan_error(dir + "/window.yaml", false, "window.yaml:8: model.sliding_window: 0 is not positive");
  std::ofstream(dir + "/llama-window.yaml") << sizes << "ffn_hidden_size: 14336\nsliding_window: 4096\n";
  expect_plan_error(dir + "/llama-window.yaml", false,
                    "llama-window.yaml:7: model.sliding_window: a sliding window needs model.arch 'mistral' or "
                    "'mixtral', not 'llama' (default)");
  std::ofstream(dir + "/gqa.yaml") << "num_layers: 32\nhidden_size: 4096\nnum_heads: 32\nnum_kv_heads: 3\n"
                                      "vocab_size: 32000\nffn_hidden_size: 11008\n";
  expect_plan_error(dir + "/gqa.yaml", false,
                    "gqa.yaml:4: model.num_kv_heads: 3 does not divide model.num_heads 32; choose a divisor of 32");
  std::ofstream(dir + "/no-ffn.yaml") << sizes;
  expect_plan_error(dir + "/no-ffn.yaml", false,
                    "no-ffn.yaml: model.ffn_hidden_size: required key is missing; a model file gives its sizes: "
                    "vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, ffn_hidden_size");
}

TEST(PlanSetupTest, LayoutErrors) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  const ModelShape m = load_model_file(config("models/llama-30b.yaml"));
  const int64_t context = 256 * 1024;
  EXPECT_THROW(make_plan_setup(h, m, 1024, 8, 1, context), PlanInputError);  // 4 KV heads (and 52 heads) over tp 8
  // Fewer KV heads than tp ranks: refused, as the trainer refuses it (no rank holds a
  // replica of a KV head; spec/model_shape.h, tp_divides_kv_heads).
  try {
    make_plan_setup(h, load_model_file(config("models/llama-7b.yaml")), 1024, 16, 1, context);
    ADD_FAILURE() << "tp 16 over 8 KV heads was accepted";
  } catch (const PlanInputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp: 16 does not divide model.num_kv_heads 8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_plan_setup(h, m, 1000, 4, 3, context), PlanInputError);  // 1000 not a multiple of 12
  const PlanSetup s = make_plan_setup(h, m, 1024, 4, 1, context);
  EXPECT_EQ(s.layout.hdp, 256);
  EXPECT_EQ(s.settings.capacity, s.memory.capacity);
  EXPECT_GT(s.settings.capacity, 1000);
  EXPECT_EQ(make_plan_setup(h, m, 1024, 4, 1, context, 4096).settings.capacity, 4096);
  EXPECT_THROW(plan_policy("greedy"), PlanInputError);
}

// Mixtral-8x7B on 64 GPUs at tp 8 (hdp 8): ep shards the experts' weights and
// gradients, so the capacity grows with ep, and the planners' layer cost carries the
// all-to-alls (over the network: a tp 8 group fills a node) per token.
TEST(PlanSetupTest, ExpertParallelSetup) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  const ModelShape m = load_model_file(config("models/mistral-8x7b.yaml"));
  const int64_t context = 64 * 1024;
  const PlanSetup one = make_plan_setup(h, m, 64, 8, 1, context);
  const PlanSetup four = make_plan_setup(h, m, 64, 8, 1, context, 0, 4);
  EXPECT_EQ(one.ep, 1);
  EXPECT_EQ(four.ep, 4);
  EXPECT_GT(four.settings.capacity, one.settings.capacity);
  EXPECT_DOUBLE_EQ(one.settings.cost.b1, one.costs.cost.b1);
  // 4 row all-to-alls (dispatch and combine forward, their gradients backward) x 4096
  // x 2 bytes x 2 experts x 3/4 leave each GPU at 50 GB/s: 49152 bytes, 0.98304 us.
  EXPECT_DOUBLE_EQ(four.costs.all_to_all_bytes_per_s, h.internode_bytes_per_s);
  EXPECT_DOUBLE_EQ(four.settings.cost.b1,
                   four.costs.cost.b1 + 4 * 4096.0 * 2 * 2 * 3 / 4 / h.internode_bytes_per_s);
  EXPECT_THROW(make_plan_setup(h, m, 64, 8, 1, context, 0, 3), PlanInputError);   // 8 experts
  EXPECT_THROW(make_plan_setup(h, m, 32, 8, 1, context, 0, 8), PlanInputError);   // hdp 4
  EXPECT_THROW(make_plan_setup(h, load_model_file(config("models/llama-7b.yaml")), 64, 8, 1, context, 0, 2),
               PlanInputError);
}

// Recomputation frees activation memory: LLaMA-70B at tp 8, pp 2 saves 84,520 B per
// token and layer without it, 51,744 B selective and 18,464 B under full (a ring
// layer's, spec/model_shape.h), so C grows none < selective < full. Offload is on
// with none only (the trainer never offloads a recomputed layer), and only full
// reruns FLOPs that the cost model counts.
TEST(PlanSetupTest, RecomputeRaisesTheCapacity) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  const ModelShape m = load_model_file(config("models/llama-70b.yaml"));
  int64_t previous = 0;
  for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
    const PlanSetup s = make_plan_setup(h, m, 128, 8, 2, 128 * K, 0, 1, 1, mode);
    EXPECT_EQ(s.recompute, mode);
    EXPECT_GT(s.settings.capacity, previous) << enum_name(kRecomputeModeNames, mode);
    // free bytes / (2 in flight x 40 layers x bytes per token and layer), stage 0.
    EXPECT_EQ(s.settings.capacity, static_cast<int64_t>(s.memory.free_bytes[0] / (2 * 40 * s.settings.cost.a2)));
    EXPECT_EQ(s.settings.offload.enabled, mode == RecomputeMode::None);
    EXPECT_EQ(s.settings.cost.rb > 0, mode == RecomputeMode::Full);
    previous = s.settings.capacity;
  }
  const auto bytes = [&](RecomputeMode mode) {
    return make_plan_setup(h, m, 128, 8, 2, 128 * K, 0, 1, 1, mode).settings.cost.a2;
  };
  EXPECT_DOUBLE_EQ(bytes(RecomputeMode::None), 84'520);
  EXPECT_DOUBLE_EQ(bytes(RecomputeMode::Selective), 51'744);
  EXPECT_DOUBLE_EQ(bytes(RecomputeMode::Full), 18'464);
}

// Recomputation mixed into offload (PlanSetup::mixed, planning/activation_mix.h):
// LLaMA-70B on 128 GPUs (tp 8, pp 2, hdp 8) at 128K, C = 6,162 tokens without
// recomputation. Rings sized by device memory alone (naive-no-offload) cannot hold a
// 128K sequence on 8 ranks (16K tokens each); with full layers mixed in, its members
// recompute some of their 40 layers, which keep 18,464 of 84,520 B per token. Micro-
// batches within C recompute nothing, the rerun lengthens the simulated step, and
// mixing needs recompute none for every layer and one model chunk per stage.
TEST(PlanSetupTest, RecomputationMixedIntoOffloadPlacesWhatMemoryAloneCannot) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  const ModelShape m = load_model_file(config("models/llama-70b.yaml"));
  const std::vector<int64_t> lengths = global_batch_lengths("byted", 128 * K, 4 * M, 1);
  const PlanSetup none = make_plan_setup(h, m, 128, 8, 2, 128 * K);
  const PlanSetup mixed = make_plan_setup(h, m, 128, 8, 2, 128 * K, 0, 1, 1, RecomputeMode::None, false,
                                          RecomputeMode::Full);
  ASSERT_EQ(mixed.settings.capacity, 6162);
  EXPECT_THROW(plan_policy("naive-no-offload")(lengths, none), std::invalid_argument);
  StepPlan plan = plan_policy("naive-no-offload")(lengths, mixed);
  check_plan(plan, lengths, mixed.settings.layers_per_stage, mixed.settings.pipeline_stages);
  EXPECT_NEAR(plan.recomputed_layer_share, 18464.0 / 84520.0, 1e-12);
  int recomputing = 0;
  for (const auto& rank : plan.ranks)
    for (const PlannedMicroBatch& mb : rank) {
      EXPECT_EQ(mb.offload_ratio, 0);
      EXPECT_LE(mb.recompute_layers, 40);
      if (mb.tokens() <= 6162) {
        EXPECT_EQ(mb.recompute_layers, 0);
      }
      recomputing += mb.recompute_layers > 0;
    }
  EXPECT_GT(recomputing, 0);
  const double step = simulate_step(plan, lengths, mixed.costs).step_seconds;
  for (auto& rank : plan.ranks)
    for (PlannedMicroBatch& mb : rank) mb.recompute_layers = 0;
  EXPECT_GT(step, simulate_step(plan, lengths, mixed.costs).step_seconds);
  EXPECT_THROW(make_plan_setup(h, m, 128, 8, 2, 128 * K, 0, 1, 1, RecomputeMode::Selective, false, RecomputeMode::Full),
               PlanInputError);
  // A stage's first layers recompute: one model chunk per stage.
  EXPECT_NO_THROW(make_plan_setup(h, m, 1024, 8, 4, 8 * K, 8 * K, 1, 2));
  EXPECT_THROW(make_plan_setup(h, m, 1024, 8, 4, 8 * K, 8 * K, 1, 2, RecomputeMode::None, false, RecomputeMode::Full),
               PlanInputError);
}

// Sequence parallelism holds the norms' and the residual stream's saved tensors for
// 1/tp of the tokens: LLaMA-70B at tp 8, pp 2 saves 27,169 B per token and layer
// without recomputation (84,520 less 7/8 of four hidden-wide bf16 rows of 8,192 and of
// two fp32 1/rms), 23,072 B selective (two rows) and 4,128 B full (a ring layer's:
// the input row), so C grows by as much; offload is off with it (the trainer refuses
// offload under it, so recomputation mixed into offload is refused with it too), and
// it is refused where the trainer refuses it: without tp, and for a mixture of experts.
TEST(PlanSetupTest, SequenceParallelismRaisesTheCapacity) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  const ModelShape m = load_model_file(config("models/llama-70b.yaml"));
  const double want[] = {27'169, 23'072, 4'128};
  int i = 0;
  for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
    const PlanSetup plain = make_plan_setup(h, m, 128, 8, 2, 128 * K, 0, 1, 1, mode);
    const PlanSetup s = make_plan_setup(h, m, 128, 8, 2, 128 * K, 0, 1, 1, mode, true);
    EXPECT_TRUE(s.sequence_parallel);
    EXPECT_DOUBLE_EQ(s.settings.cost.a2, want[i++]) << enum_name(kRecomputeModeNames, mode);
    EXPECT_EQ(s.settings.capacity, static_cast<int64_t>(s.memory.free_bytes[0] / (2 * 40 * s.settings.cost.a2)));
    EXPECT_GT(s.settings.capacity, plain.settings.capacity);
    EXPECT_FALSE(s.settings.offload.enabled);
  }
  EXPECT_THROW(make_plan_setup(h, m, 128, 1, 2, 128 * K, 0, 1, 1, RecomputeMode::None, true), PlanInputError);
  EXPECT_THROW(make_plan_setup(h, m, 128, 8, 2, 128 * K, 0, 1, 1, RecomputeMode::None, true, RecomputeMode::Full),
               PlanInputError);
  EXPECT_THROW(make_plan_setup(h, load_model_file(config("models/mistral-8x7b.yaml")), 64, 8, 1, 64 * K, 0, 1, 1,
                               RecomputeMode::None, true),
               PlanInputError);
}

// Under sequence parallelism a stage boundary carries each tp rank's 1/tp of the
// residual stream's rows (the trainer's LlamaModel::residual_rows), not the whole
// sequence. LLaMA-7B on 16 GPUs (tp 8, pp 2, hdp 1), one sequence of 4,096 tokens:
// each GPU sends 4,096 x 4,096 x 2 B = 32 MiB forward and its gradient back, 4 MiB
// each with sequence parallelism. Both sends are on the step's critical path (one
// micro-batch) and cross nodes (a tp 8 group fills one) at 50 GB/s, so the step
// shortens by 2 x 4,096 x (8,192 - 1,024) B / 50e9 B/s = 1.1744 ms; the compute is
// the same.
TEST(PlanSetupTest, SequenceParallelismSendsAShardAcrossStages) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  const ModelShape m = load_model_file(config("models/llama-7b.yaml"));
  const std::vector<int64_t> lengths = {4096};
  const PlanSetup plain = make_plan_setup(h, m, 16, 8, 2, 4096);
  const PlanSetup sp = make_plan_setup(h, m, 16, 8, 2, 4096, 0, 1, 1, RecomputeMode::None, true);
  EXPECT_DOUBLE_EQ(plain.costs.boundary_bytes_per_token, 8192);
  EXPECT_DOUBLE_EQ(sp.costs.boundary_bytes_per_token, 1024);
  const StepSimulation a = simulate_step(plan_policy("naive")(lengths, plain), lengths, plain.costs);
  const StepSimulation b = simulate_step(plan_policy("naive")(lengths, sp), lengths, sp.costs);
  // Both directions, from every GPU of the tp group.
  EXPECT_DOUBLE_EQ(a.pipeline_bytes, 2.0 * 8192 * 4096 * 8);
  EXPECT_DOUBLE_EQ(b.pipeline_bytes, 2.0 * 1024 * 4096 * 8);
  EXPECT_DOUBLE_EQ(a.compute_seconds, b.compute_seconds);
  ASSERT_DOUBLE_EQ(h.internode_bytes_per_s, 50e9);
  EXPECT_NEAR(a.step_seconds - b.step_seconds, 2 * 4096.0 * (8192 - 1024) / 50e9, 1e-12);
}

// Interleaved 1F1B in `trainer plan` (--vpp): LLaMA-70B over pp 4 on 1,024 GPUs, 8
// equal micro-batches of 8K tokens per rank. The virtual stages split the layers
// alike, the same work runs, and the simulated idle time (the pipeline bubble plus
// the gradient sync, the same at every vpp) shrinks as (p - 1) / (vpp m) does.
TEST(PlanSetupTest, InterleavedPipelineShrinksTheBubble) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  const ModelShape m = load_model_file(config("models/llama-70b.yaml"));
  const std::vector<int64_t> lengths(256, 8 * K);
  std::vector<double> step, compute;
  for (int vpp : {1, 2, 4}) {
    const PlanSetup s = make_plan_setup(h, m, 1024, 8, 4, 8 * K, 8 * K, 1, vpp);
    EXPECT_EQ(s.layout.vpp, vpp);
    EXPECT_EQ(s.stage_layers, (std::vector<int64_t>{20, 20, 20, 20}));
    EXPECT_EQ(s.costs.chunk_layers, vpp == 1 ? std::vector<int64_t>{} : std::vector<int64_t>(4 * vpp, 20 / vpp));
    const StepPlan plan = plan_policy("naive")(lengths, s);
    ASSERT_EQ(plan.ranks[0].size(), 8u);
    const StepSimulation sim = simulate_step(plan, lengths, s.costs);
    step.push_back(sim.step_seconds);
    compute.push_back(sim.max_busy_seconds);
  }
  const double sync = gradient_sync(make_plan_setup(h, m, 1024, 8, 4, 8 * K, 8 * K).costs, 0).seconds();
  for (int i = 0; i < 3; ++i) {
    const int vpp = 1 << i;
    // The pipeline part of the step over the busiest stage's compute: 1 + the bubble,
    // and up to 5% above it from the pipeline transfers (a micro-batch crosses
    // 4 vpp - 1 stage boundaries each way: 1.0%, 1.5% and 4.1% at vpp 1, 2, 4).
    const double ratio = (step[i] - sync) / compute[i];
    EXPECT_GT(ratio, 1 + pipeline_bubble_fraction(4, vpp, 8)) << vpp;
    EXPECT_LT(ratio, 1 + pipeline_bubble_fraction(4, vpp, 8) + 0.05) << vpp;
  }
  EXPECT_LT(step[1], step[0]);
  EXPECT_LT(step[2], step[1]);
  EXPECT_THROW(make_plan_setup(h, m, 1024, 8, 1, 8 * K, 0, 1, 2), PlanInputError);   // nothing to interleave
  EXPECT_THROW(make_plan_setup(h, m, 1024, 8, 4, 8 * K, 0, 1, 21), PlanInputError);  // 84 virtual stages > 80 layers
}

// No plan beats the step's lower bound: every policy's simulated step is at least
// simulated_step_bound over random batches (two distributions, seeds, and uniform
// lengths) on layouts with rings, pipelines, forced offload, a sliding window and
// expert parallelism, and under recomputation (rings whose layers keep their
// attention rerun less than local sequences: the bound counts their rerun), on the
// cluster at its peaks and derated (slower links and small kernels only lengthen
// the step). (1e-12 relative: the bound and the simulation add the same durations
// in different orders.)
TEST(PlanBound, NoPolicyBeatsTheBound) {
  for (const char* cluster : {"h100", "h100-derated"}) {
    const HardwareProfile h = load_cluster_file(config("cluster/" + std::string(cluster) + ".yaml"));
    struct Layout {
      const char* model;
      int gpus, tp, pp, ep;
      int64_t context;
      RecomputeMode recompute = RecomputeMode::None;
      RecomputeMode mixed = RecomputeMode::None;
    };
    const Layout layouts[] = {{"llama-7b", 64, 8, 1, 1, 256 * K},    {"llama-7b", 16, 1, 1, 1, 64 * K},
                              {"llama-70b", 128, 8, 2, 1, 64 * K},   {"llama-70b", 256, 8, 4, 1, 256 * K},
                              {"mistral-7b", 64, 8, 1, 1, 256 * K},  {"mistral-8x7b", 64, 8, 1, 2, 64 * K},
                              {"llama-7b", 64, 8, 1, 1, 256 * K, RecomputeMode::Full},
                              {"llama-70b", 128, 8, 2, 1, 64 * K, RecomputeMode::Selective},
                              {"llama-70b", 128, 8, 2, 1, 64 * K, RecomputeMode::Full},
                              {"llama-70b", 128, 8, 2, 1, 64 * K, RecomputeMode::None, RecomputeMode::Full},
                              {"llama-7b", 64, 8, 1, 1, 256 * K, RecomputeMode::None, RecomputeMode::Selective}};
    std::mt19937_64 rng(5);
    int simulated = 0, offloading = 0, pipelined = 0;
    for (const Layout& l : layouts) {
      const PlanSetup setup = make_plan_setup(h, load_model_file(config("models/" + std::string(l.model) + ".yaml")),
                                              l.gpus, l.tp, l.pp, l.context, 0, l.ep, 1, l.recompute, false, l.mixed);
      for (int trial = 0; trial < 4; ++trial) {
        std::vector<int64_t> lengths;
        if (trial < 3) {
          lengths = global_batch_lengths(trial == 1 ? "github" : "byted", l.context, 4 * M, 1 + trial);
        } else {
          std::uniform_int_distribution<int64_t> len(1, l.context);
          for (int64_t total = 0; total < 2 * M;) total += lengths.emplace_back(len(rng));
        }
        const StepBound bound = simulated_step_bound(setup, lengths);
        ASSERT_GT(bound.seconds(), 0);
        for (const auto& [name, planner] : plan_policies()) {
          StepPlan plan;
          try {
            plan = planner(lengths, setup);
          } catch (const std::invalid_argument&) {
            continue;  // the policy cannot place this batch
          }
          check_plan(plan, lengths, setup.settings.layers_per_stage, setup.settings.pipeline_stages);
          const StepSimulation sim = simulate_step(plan, lengths, setup.costs);
          EXPECT_GE(sim.step_seconds, bound.seconds() * (1 - 1e-12))
              << cluster << ": " << l.model << " on " << l.gpus << " GPUs, pp " << l.pp << ", trial " << trial
              << ", " << name << ": work " << bound.work << ", longest " << bound.longest << ", offload " << bound.offload;
          ++simulated;
          offloading += bound.offload > 0;
          pipelined += l.pp > 1;
        }
      }
    }
    EXPECT_GE(simulated, 60) << cluster;
    EXPECT_GT(offloading, 0) << cluster;  // some batch had a sequence that must offload
    EXPECT_GT(pipelined, 0) << cluster;
  }
}

// `trainer plan` searches each policy's setups in ascending order of their bound,
// skipping a setup whose bound exceeds a step already simulated and reusing the
// outcome of an equal plan under the same costs (search_setups): the setup chosen
// and its step are the exhaustive search's, on layouts where both happen.
TEST(PlanSearch, PruningAndSharedPlansNeverChangeTheChoice) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  struct Layout {
    const char* model;
    int gpus, tp, pp;
    int64_t context;
  };
  const Layout layouts[] = {{"llama-7b", 64, 8, 1, 256 * K},
                            {"llama-7b", 16, 1, 1, 64 * K},
                            {"llama-70b", 128, 8, 2, 64 * K},
                            {"llama-70b", 256, 8, 4, 256 * K}};
  constexpr RecomputeMode none = RecomputeMode::None, selective = RecomputeMode::Selective,
                          full = RecomputeMode::Full;
  struct Mode {
    RecomputeMode recompute, mixed;
    bool sequence_parallel;
  };
  const Mode modes[] = {{none, none, false},      {none, selective, false}, {none, full, false},
                        {selective, none, false}, {full, none, false},      {none, none, true},
                        {selective, none, true},  {full, none, true}};
  int searches = 0, pruned = 0, shared = 0, placed = 0;
  for (const Layout& l : layouts) {
    const ModelShape model = load_model_file(config("models/" + std::string(l.model) + ".yaml"));
    std::vector<PlanSetup> setups;
    for (const Mode& m : modes) {
      if (m.sequence_parallel && l.tp == 1) continue;
      try {
        setups.push_back(make_plan_setup(h, model, l.gpus, l.tp, l.pp, l.context, 0, 1, 1, m.recompute,
                                         m.sequence_parallel, m.mixed));
      } catch (const PlanInputError&) {
        // memory cannot hold the model under this setup
      }
    }
    ASSERT_GE(setups.size(), 4u) << l.model;
    for (const char* lengths_source : {"byted", "github"}) {
      const std::vector<int64_t> lengths = global_batch_lengths(lengths_source, l.context, 4 * M, 1);
      for (const auto& [policy, planner] : plan_policies()) {
        const SetupSearch fast = search_setups(policy, setups, lengths);
        const SetupSearch all = search_setups(policy, setups, lengths, true);
        const std::string where = std::string(l.model) + " on " + std::to_string(l.gpus) + " GPUs, pp " +
                                  std::to_string(l.pp) + ", " + lengths_source + ", " + policy;
        EXPECT_EQ(all.simulated, static_cast<int>(setups.size())) << where;
        EXPECT_EQ(all.shared + all.pruned, 0) << where;
        EXPECT_EQ(fast.simulated + fast.shared + fast.pruned, static_cast<int>(setups.size())) << where;
        EXPECT_EQ(fast.placed, all.placed) << where;
        EXPECT_EQ(fast.chosen, all.chosen) << where;
        EXPECT_EQ(fast.step_seconds, all.step_seconds) << where;
        ++searches;
        pruned += fast.pruned;
        shared += fast.shared;
        placed += fast.placed;
      }
    }
  }
  EXPECT_EQ(searches, 4 * 2 * static_cast<int>(plan_policies().size()));
  // Both shortcuts were taken (37 setups pruned and 8 shared when written), and
  // every search placed the batch.
  EXPECT_GT(pruned, 20);
  EXPECT_GT(shared, 4);
  EXPECT_EQ(placed, searches);
}

// `trainer plan`'s balance compares its candidates by the simulated step, plan_naive's
// plans among them, with and without offload: never slower than either, nor than
// plan_balance deciding by its predicted busiest rank.
TEST(PlanBalancePolicy, NeverSlowerThanNaiveOrThePredictedChoice) {
  const HardwareProfile h = load_cluster_file(config("cluster/h100.yaml"));
  int pipelined = 0, without_offload = 0;
  struct Layout {
    int gpus, pp;
    int64_t context;
  };
  for (const Layout& l : {Layout{128, 2, 256 * K}, Layout{256, 4, 256 * K}, Layout{64, 1, 256 * K},
                          Layout{256, 4, 64 * K}}) {
    const int pp = l.pp;
    const PlanSetup setup =
        make_plan_setup(h, load_model_file(config("models/llama-70b.yaml")), l.gpus, 8, pp, l.context, 0, 1);
    for (int seed = 1; seed <= 3; ++seed) {
      const std::vector<int64_t> lengths =
          global_batch_lengths(seed == 2 ? "github" : "byted", l.context, 4 * M, seed);
      auto step = [&](const StepPlan& plan) { return simulate_step(plan, lengths, setup.costs).step_seconds; };
      const StepPlan balance = plan_policy("balance")(lengths, setup);
      check_plan(balance, lengths, setup.settings.layers_per_stage, setup.settings.pipeline_stages);
      const double chosen = step(balance);
      const StepPlan deep = plan_policy("balance-deep")(lengths, setup);
      check_plan(deep, lengths, setup.settings.layers_per_stage, setup.settings.pipeline_stages);
      EXPECT_LE(step(deep), chosen * (1 + 1e-12)) << "pp " << pp << " seed " << seed;
      EXPECT_LE(chosen, step(plan_policy("naive")(lengths, setup)) * (1 + 1e-12)) << "pp " << pp << " seed " << seed;
      EXPECT_LE(chosen, step(plan_balance(lengths, setup.settings, setup.balance)) * (1 + 1e-12))
          << "pp " << pp << " seed " << seed;
      try {
        EXPECT_LE(chosen, step(plan_policy("naive-no-offload")(lengths, setup)) * (1 + 1e-12))
            << "pp " << pp << " seed " << seed;
        ++without_offload;
      } catch (const std::invalid_argument&) {
        // a sequence needs offload
      }
      pipelined += pp > 1 && !balance.rings.empty();
    }
  }
  EXPECT_GT(pipelined, 0);  // some pipelined batch had rings
  EXPECT_GT(without_offload, 0);
}

// One rank, one sequence: nothing waits, and the simulated step is the bound. LLaMA-7B
// at tp 8: 32 layers of T(4096) and the head, then the optimizer (hdp 1 needs no
// collectives).
TEST(PlanBound, OneRankOneSequenceReachesIt) {
  const PlanSetup setup = make_plan_setup(load_cluster_file(config("cluster/h100.yaml")),
                                          load_model_file(config("models/llama-7b.yaml")), 8, 8, 1, 4096);
  const std::vector<int64_t> lengths = {4096};
  const StepBound bound = simulated_step_bound(setup, lengths);
  const StepCosts& k = setup.costs;
  const double expected = 32 * k.cost.compute_seconds(4096) + 4096 * k.head_seconds_per_token + k.optimizer_seconds[0];
  EXPECT_NEAR(bound.work, expected, expected * 1e-12);
  EXPECT_DOUBLE_EQ(bound.longest, bound.work);  // the one sequence is all the work
  const StepSimulation sim = simulate_step(plan_policy("naive")(lengths, setup), lengths, k);
  EXPECT_NEAR(sim.step_seconds, bound.seconds(), expected * 1e-12);
}

// The command end to end on a small cluster: 64 GPUs, tp 8, 256K context.
TEST(PlanCommand, RunsAndWritesTraces) {
  const std::string dir = scratch_dir("plan_command");
  const std::string args = "plan --cluster " + config("cluster/h100.yaml") + " --model " +
                           config("models/llama-7b.yaml") +
                           " --gpus 64 --tp 8 --context 256K --global-batch-tokens 4M --lengths byted --seed 3 "
                           "--policies static,naive --trace " + dir + "/step.json";
  const auto r = run_trainer(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle : {"hdp 8", "static", "naive", "tokens/s", "of bound", "no plan beats it", "1.00x",
                             "ranks per spread sequence", "timing"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  for (const char* policy : {"static", "naive"}) {
    std::ifstream in(dir + "/step-" + std::string(policy) + ".json");
    ASSERT_TRUE(in) << policy;
    const std::string json((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(json.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0), 0u);
    for (int pid = 0; pid < 8; ++pid)
      EXPECT_NE(json.find("\"pid\":" + std::to_string(pid) + ","), std::string::npos) << policy << " pid " << pid;
    EXPECT_EQ(json.find("\"pid\":8,"), std::string::npos) << policy;
    EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
    EXPECT_EQ(json.substr(json.size() - 4), "\n]}\n");
  }
  // One policy: the trace goes to the file named.
  const auto one = run_trainer("plan --cluster " + config("cluster/h100.yaml") + " --model " +
                               config("models/llama-70b.yaml") +
                               " --gpus 128 --tp 8 --pp 2 --context 64K --global-batch-tokens 2M --lengths github "
                               "--policies naive --trace " + dir + "/one.json");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::ifstream in(dir + "/one.json");
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(json.find("pp-fwd-recv"), std::string::npos);
  EXPECT_NE(json.find("\"pid\":15,"), std::string::npos);  // hdp 8 x pp 2 processes
}

// Mistral-7B plans with its sliding window; its simulated compute is below the same
// shape with full attention at a 256K context.
TEST(PlanCommand, MistralSlidingWindowCutsTheSimulatedCompute) {
  const std::string dir = scratch_dir("plan_command_mistral");
  std::ifstream in(config("models/mistral-7b.yaml"));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  text.erase(text.find("sliding_window:"));
  std::ofstream(dir + "/full.yaml") << text;
  auto plan = [&](const std::string& model) {
    const auto r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + " --model " + model +
                               " --gpus 64 --tp 8 --context 256K --global-batch-tokens 4M --lengths byted --seed 3 "
                               "--policies naive");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string windowed = plan(config("models/mistral-7b.yaml")), full = plan(dir + "/full.yaml");
  EXPECT_NE(windowed.find("sliding window 4096"), std::string::npos) << windowed;
  EXPECT_EQ(full.find("sliding window"), std::string::npos) << full;
  EXPECT_NE(windowed, full);
}

// Mixtral-8x7B and 8x22B plan end to end. Without --ep every ep dividing hdp 8 and
// the 8 experts is planned; 8x22B's 141 B parameters do not fit 64 GPUs at tp 8
// without ep (its experts' bf16 weights and fp32 gradients alone take 6 x 135 B / 8 =
// 101 GB per GPU).
TEST(PlanCommand, MixtralPlansWithExpertParallelism) {
  auto plan = [&](const std::string& model, const std::string& extra) {
    return run_trainer("plan --cluster " + config("cluster/h100.yaml") + " --model " + config("models/" + model) +
                       " --gpus 64 --tp 8 --context 64K --global-batch-tokens 2M --lengths github --seed 3 "
                       "--policies naive,balance" + extra);
  };
  const auto small = plan("mistral-8x7b.yaml", "");
  ASSERT_EQ(small.exit_code, 0) << small.output;
  for (const char* needle : {"46.70 B parameters, 12.88 B active per token", "ep       1: C = ", "ep       2: C = ",
                             "ep       4: C = ", "ep       8: C = ", "chosen", "balance", "tokens/s"})
    EXPECT_NE(small.output.find(needle), std::string::npos) << needle << "\n" << small.output;
  const auto big = plan("mistral-8x22b.yaml", "");
  ASSERT_EQ(big.exit_code, 0) << big.output;
  for (const char* needle : {"vocab 32768", "ep       1: does not fit", "ep       8: C = ", "chosen", "balance"})
    EXPECT_NE(big.output.find(needle), std::string::npos) << needle << "\n" << big.output;
  // A fixed ep: no search; the all-to-alls are reported.
  const auto fixed = plan("mistral-8x22b.yaml", " --ep 8");
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_EQ(fixed.output.find("chosen"), std::string::npos) << fixed.output;
  EXPECT_NE(fixed.output.find("ep 8 (1 of 8 experts per GPU"), std::string::npos) << fixed.output;
  EXPECT_NE(fixed.output.find("expert all-to-all"), std::string::npos) << fixed.output;
  const auto bad = plan("mistral-8x7b.yaml", " --ep 3");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("parallel.ep: 3 does not divide parallel.hdp 8"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("choose a divisor of 8"), std::string::npos) << bad.output;
  const auto unfit = plan("mistral-8x22b.yaml", " --ep 1");
  EXPECT_EQ(unfit.exit_code, 2) << unfit.output;
  EXPECT_NE(unfit.output.find("does not fit"), std::string::npos) << unfit.output;
}

// --recompute auto and --sequence-parallel auto (the defaults) plan each policy under
// every setup (none, selective, full; none also with selective or full layers mixed
// into offload; with tp above 1 each mode also with sequence parallelism, which has no
// offload) and keep the shortest simulated step, so auto is never slower than any
// fixed setup, and the table says which setup each policy used. LLaMA-70B on 128 GPUs
// (tp 8, pp 2, hdp 8) at 128K: without sequence parallelism static fits only under
// full (C 6,162 and 10,065 tokens hold no 128K sequence over 8 ranks), and neither
// naive nor balance under selective; with it every mode fits, static is fastest under
// selective+sp (C 22,574 tokens), naive and balance under none+sp (19,170 tokens, without offload).
TEST(PlanCommand, AutoIsNeverSlowerThanAFixedSetup) {
  const std::string base = "plan --cluster " + config("cluster/h100.yaml") + " --model " +
                           config("models/llama-70b.yaml") +
                           " --gpus 128 --tp 8 --pp 2 --context 128K --global-batch-tokens 4M --lengths byted "
                           "--seed 1 --policies static,naive,balance";
  // policy -> (setup column, step seconds as printed) of one run's table.
  auto table = [&](const std::string& setup) {
    const auto r = run_trainer(base + setup);
    std::map<std::string, std::pair<std::string, double>> rows;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line);
      std::string policy, column, plan_seconds;
      double step = 0;
      if (!(words >> policy >> column >> plan_seconds >> step)) continue;
      for (const char* label : {"none", "selective", "full", "none+selective", "none+full", "none+sp", "selective+sp",
                                "full+sp"})
        if (column == label) rows[policy] = {column, step};
    }
    // No policy places the batch: exit 2.
    EXPECT_EQ(r.exit_code, rows.empty() ? 2 : 0) << r.output;
    return rows;
  };
  const auto chosen = table("");
  ASSERT_EQ(chosen.size(), 3u);
  EXPECT_EQ(chosen.at("static").first, "selective+sp");
  EXPECT_EQ(chosen.at("naive").first, "none+sp");
  EXPECT_EQ(chosen.at("balance").first, "none+sp");
  int placed = 0;
  for (const char* mode : {"none", "selective", "full"}) {
    for (const bool sp : {false, true}) {
      const std::string label = std::string(mode) + (sp ? "+sp" : "");
      const auto fixed = table(std::string(" --recompute ") + mode + " --sequence-parallel " + (sp ? "on" : "off"));
      for (const auto& [policy, row] : fixed) {
        EXPECT_EQ(row.first, label);
        EXPECT_LE(chosen.at(policy).second, row.second) << policy << " under " << label;
        if (row.first == chosen.at(policy).first) {
          EXPECT_EQ(chosen.at(policy).second, row.second) << policy;
        }
        ++placed;
      }
      if (label == "none" || label == "selective") {
        EXPECT_EQ(fixed.count("static"), 0u) << label;  // does not fit
      }
      if (label == "selective") {
        EXPECT_TRUE(fixed.empty());
      }
    }
  }
  EXPECT_EQ(placed, 3 * 6 - 3 - 1);
  // A fixed mode plans what it names (sequence parallelism off) unless
  // --sequence-parallel auto asks for the faster of the two.
  const auto none = table(" --recompute none");
  EXPECT_EQ(none.at("naive").first, "none");
  const auto either = table(" --recompute none --sequence-parallel auto");
  EXPECT_EQ(either.at("naive").first, "none+sp");
  EXPECT_EQ(either.at("naive").second, chosen.at("naive").second);
  const auto bad = run_trainer(base + " --recompute partial");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--recompute 'partial': choose auto, none"), std::string::npos) << bad.output;
}

// balance-deep runs one model chunk per stage: with --vpp above 1 the command is
// refused before it plans or prints anything (exit 2, naming both flags).
TEST(PlanCommand, BalanceDeepIsRefusedWithInterleavedPipelinesBeforeAnyPlanning) {
  const auto r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + " --model " +
                             config("models/llama-70b.yaml") +
                             " --gpus 1024 --tp 8 --pp 4 --vpp 2 --context 32K --global-batch-tokens 1M "
                             "--lengths byted --seed 1 --policies balance,balance-deep");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--policies balance-deep runs one model chunk per stage; drop --vpp"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("policy "), std::string::npos) << "planned before refusing:\n" << r.output;
}

// With tp 1 there is no sequence parallelism to choose: auto never tries it, and
// --sequence-parallel on is refused, as it is for a mixture of experts (the trainer
// runs it for dense models only). The bare flag of before is refused naming its
// replacement.
TEST(PlanCommand, SequenceParallelismOnlyWithTensorParallelismAndADenseModel) {
  const std::string cluster = "plan --cluster " + config("cluster/h100.yaml");
  const std::string dense = cluster + " --model " + config("models/llama-7b.yaml") +
                            " --gpus 8 --context 32K --global-batch-tokens 256K --lengths byted --seed 1";
  const auto alone = run_trainer(dense);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_NE(alone.output.find("setups   per policy the shortest simulated step of: C = none "), std::string::npos)
      << alone.output;
  EXPECT_EQ(alone.output.find("+sp"), std::string::npos) << alone.output;
  const auto split = run_trainer(dense + " --tp 8");
  ASSERT_EQ(split.exit_code, 0) << split.output;
  EXPECT_NE(split.output.find(", full+sp "), std::string::npos) << split.output;
  const auto on = run_trainer(dense + " --sequence-parallel on");
  EXPECT_EQ(on.exit_code, 2) << on.output;
  EXPECT_NE(on.output.find("--sequence-parallel on: sequence parallelism needs tp above 1, not 1"), std::string::npos)
      << on.output;
  const auto bare = run_trainer(dense + " --tp 8 --sequence-parallel --recompute full");
  EXPECT_EQ(bare.exit_code, 2) << bare.output;
  EXPECT_NE(bare.output.find("--sequence-parallel takes a value now: on (what the bare flag meant)"),
            std::string::npos)
      << bare.output;
  const auto last = run_trainer(dense + " --tp 8 --sequence-parallel");
  EXPECT_EQ(last.exit_code, 2) << last.output;
  EXPECT_NE(last.output.find("--sequence-parallel takes a value now"), std::string::npos) << last.output;
  const auto other = run_trainer(dense + " --tp 8 --sequence-parallel yes");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("--sequence-parallel 'yes': choose auto, on or off"), std::string::npos) << other.output;
  const auto moe = run_trainer(cluster + " --model " + config("models/mistral-8x7b.yaml") +
                               " --gpus 64 --tp 8 --context 64K --global-batch-tokens 2M --lengths github "
                               "--sequence-parallel on");
  EXPECT_EQ(moe.exit_code, 2) << moe.output;
  EXPECT_NE(moe.output.find("--sequence-parallel on: sequence parallelism is for dense models"), std::string::npos)
      << moe.output;
}

// A sequence that fits only with sequence parallelism (the LLaMA-70B Byted 2M cell of
// docs/performance.md in small): LLaMA-70B on 128 GPUs (tp 8, pp 4, hdp 4), one 512K
// document among 4K ones. Without sequence parallelism a GPU holds at most 36,864
// tokens (full), so the document needs 15 ranks of the 4; with it full holds 164,888
// tokens and 4 ranks hold the document, so auto places it under every policy.
TEST(PlanCommand, AutoChoosesSequenceParallelismWhereOnlyItFits) {
  const std::string dir = scratch_dir("plan_command_sp");
  {
    std::ofstream lengths(dir + "/lengths.txt");
    lengths << 512 * K << "\n";
    for (int i = 0; i < 64; ++i) lengths << 4 * K << "\n";
  }
  const std::string base = "plan --cluster " + config("cluster/h100.yaml") + " --model " +
                           config("models/llama-70b.yaml") +
                           " --gpus 128 --tp 8 --pp 4 --context 512K --global-batch-tokens 1M --lengths " + dir +
                           "/lengths.txt --policies static,naive,balance";
  const auto without = run_trainer(base + " --sequence-parallel off");
  EXPECT_EQ(without.exit_code, 2) << without.output;
  EXPECT_NE(without.output.find("needs 15 ranks (capacity 36864 tokens"), std::string::npos) << without.output;
  const auto chosen = run_trainer(base);
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("full+sp 164,888 (4.1 KB per token and layer)"), std::string::npos) << chosen.output;
  EXPECT_EQ(chosen.output.find("does not fit"), std::string::npos) << chosen.output;
  for (const char* policy : {"static ", "naive ", "balance "}) {
    const size_t row = chosen.output.find(std::string("\n") + policy);
    ASSERT_NE(row, std::string::npos) << policy << chosen.output;
    std::istringstream words(chosen.output.substr(row + 1));
    std::string name, column;
    words >> name >> column;
    EXPECT_EQ(column, "full+sp") << policy;
  }
}

// balance-deep: balance whose candidates also run ahead of 1F1B where memory allows
// (docs/planning.md, "Running ahead of 1F1B"). Never slower than balance, and faster on
// this LLaMA-70B pp 4 batch (simulated 41.30 s against 40.45 s on 2026-11-28), where
// the winner's micro-batches after its costliest ring recompute to make room; its plan
// passes check_plan (run_policy checks every plan) with forward limits.
TEST(PlanCommand, BalanceDeepRunsAheadOfOneFOneBWhereMemoryAllows) {
  const auto r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + " --model " +
                             config("models/llama-70b.yaml") +
                             " --gpus 256 --tp 8 --pp 4 --context 256K --global-batch-tokens 4M --lengths byted "
                             "--seed 1 --policies balance,balance-deep");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, double> step;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string policy, column, plan_seconds;
    double seconds = 0;
    if (words >> policy >> column >> plan_seconds >> seconds && (policy == "balance" || policy == "balance-deep"))
      step[policy] = seconds;
  }
  ASSERT_EQ(step.size(), 2u) << r.output;
  EXPECT_LT(step.at("balance-deep"), step.at("balance") * 0.99) << r.output;
}

// With one stage there is nothing to run ahead in: balance-deep is balance, and where
// both are asked for it takes balance's outcome (search_all) with the step and setup
// that balance-deep alone plans and simulates.
TEST(PlanCommand, BalanceDeepWithOneStageIsBalance) {
  const std::string command = "plan --cluster " + config("cluster/h100.yaml") + " --model " +
                              config("models/llama-7b.yaml") +
                              " --gpus 64 --tp 8 --context 256K --global-batch-tokens 4M --lengths byted --seed 1 ";
  auto summaries = [](const std::string& output) {
    std::map<std::string, std::pair<std::string, double>> found;  // policy -> (setup, step)
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line);
      std::string policy, setup, plan_seconds;
      double seconds = 0;
      if (words >> policy >> setup >> plan_seconds >> seconds && policy.rfind("balance", 0) == 0 && !found.count(policy))
        found[policy] = {setup, seconds};
    }
    return found;
  };
  const auto both = run_trainer(command + "--policies balance,balance-deep");
  const auto alone = run_trainer(command + "--policies balance-deep");
  ASSERT_EQ(both.exit_code, 0) << both.output;
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const auto b = summaries(both.output), a = summaries(alone.output);
  ASSERT_EQ(b.size(), 2u) << both.output;
  ASSERT_EQ(a.size(), 1u) << alone.output;
  EXPECT_GT(b.at("balance").second, 0);
  EXPECT_EQ(b.at("balance-deep"), b.at("balance"));
  EXPECT_EQ(a.at("balance-deep"), b.at("balance"));
}

// --pp auto plans every pipeline degree whose tp x pp divides the GPUs (at most the
// layers), reports each one's fastest step and keeps the shortest: the same steps as
// the layouts given one by one. LLaMA-7B (32 layers), 64 GPUs at tp 8: pp 1, 2, 4, 8.
TEST(PlanCommand, PipelineAutoKeepsTheFastestLayout) {
  const std::string base = "plan --cluster " + config("cluster/h100.yaml") + " --model " +
                           config("models/llama-7b.yaml") +
                           " --gpus 64 --tp 8 --context 128K --global-batch-tokens 2M --lengths byted --seed 2 "
                           "--policies naive,balance --recompute none";
  const auto automatic = run_trainer(base + " --pp auto");
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  // The fastest step of a layout given by hand, as its table prints it.
  auto fastest = [&](int pp) {
    const auto r = run_trainer(base + " --pp " + std::to_string(pp));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    double best = std::numeric_limits<double>::infinity();
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream in(line);
      std::string policy, recompute;
      double plan_seconds = 0, step = 0;
      if ((line.rfind("naive ", 0) == 0 || line.rfind("balance ", 0) == 0) && in >> policy >> recompute >> plan_seconds >> step)
        best = std::min(best, step);
    }
    return best;
  };
  double best = std::numeric_limits<double>::infinity();
  int chosen = 0;
  for (int pp : {1, 2, 4}) {
    const std::string label = "pp       " + std::to_string(pp) + " (hdp " + std::to_string(8 / pp) + "): step ";
    const size_t at = automatic.output.find(label);
    ASSERT_NE(at, std::string::npos) << label << "\n" << automatic.output;
    const double step = std::stod(automatic.output.substr(at + label.size()));
    EXPECT_NEAR(step, fastest(pp), 0.006) << "pp " << pp;
    if (step < best) best = step, chosen = pp;
  }
  // pp 8 leaves one rank, which holds no 116,552-token sequence; pp 16 would leave half a rank.
  EXPECT_NE(automatic.output.find("pp       8 (hdp 1): does not fit: naive: a sequence of 116552 tokens needs 2 ranks"),
            std::string::npos)
      << automatic.output;
  EXPECT_EQ(automatic.output.find("pp       16"), std::string::npos) << automatic.output;
  EXPECT_NE(automatic.output.find("pp       " + std::to_string(chosen) + " chosen"), std::string::npos)
      << automatic.output;
  EXPECT_NE(automatic.output.find("tp 8 x pp " + std::to_string(chosen) + " x hdp " + std::to_string(8 / chosen)),
            std::string::npos)
      << automatic.output;
  // With --vpp the stage count must be given.
  const auto interleaved = run_trainer(base + " --pp auto --vpp 2");
  EXPECT_EQ(interleaved.exit_code, 2) << interleaved.output;
  EXPECT_NE(interleaved.output.find("--pp auto tries one model chunk per stage"), std::string::npos)
      << interleaved.output;
  const auto unknown = run_trainer(base + " --pp some");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
}

TEST(PlanCommand, BadInputExitsWithTwo) {
  const std::string dir = scratch_dir("plan_command_bad");
  const std::string base = " --model " + config("models/llama-7b.yaml") +
                           " --gpus 64 --tp 8 --context 256K --global-batch-tokens 4M";
  std::ofstream(dir + "/bad.yaml") << h100_text() << "infiniband: ndr\n";
  auto r = run_trainer("plan --cluster " + dir + "/bad.yaml" + base + " --lengths byted");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir + "/bad.yaml"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("infiniband: unknown key"), std::string::npos) << r.output;
  r = run_trainer("plan --cluster " + dir + "/none.yaml" + base + " --lengths byted");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot open the cluster file (No such file or directory)"), std::string::npos) << r.output;
  r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + base + " --lengths pile");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'pile'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("byted, github"), std::string::npos) << r.output;
  r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + base);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--lengths is required"), std::string::npos) << r.output;
  r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + base + " --lengths byted --policies static,fast");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown policy 'fast'"), std::string::npos) << r.output;
  r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + base + " --lengths byted --tp 3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_trainer("plan --cluster " + config("cluster/h100.yaml") + base + " --lengths byted --vpp 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("vpp 2"), std::string::npos) << r.output;
  r = run_trainer("plan --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--global-batch-tokens"), std::string::npos);
}

}  // namespace
}  // namespace hdp
