// The cost-model profiler: the fits (exact on synthetic timings, close under
// multiplicative noise, non-negative), the held-out error, the cost file (round
// trip, errors naming file and key, shape check, tp scaling), the start-up
// profile, and `trainer profile`. No assertion depends on how fast this machine is.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "test_util.h"
#include "config/config.h"
#include "run/planner_cost.h"
#include "run/profiler.h"
#include "run/step_planner.h"

namespace hdp {
namespace {

using testing::run_trainer;
using testing::scratch_dir;

const std::vector<double> kLengths = {128, 181, 256, 362, 512, 724, 1024, 1448, 2048, 2896, 4096, 5793, 8192};

std::vector<double> quadratic(const std::vector<double>& s, double a1, double b1, double g) {
  std::vector<double> t;
  for (double x : s) t.push_back(a1 * x * x + b1 * x + g);
  return t;
}

TEST(ProfilerFit, QuadraticRecoversExactCoefficients) {
  const double a1 = 3.25e-9, b1 = 2.5e-6, g = 1.5e-4;
  const CostFit fit = fit_quadratic(kLengths, quadratic(kLengths, a1, b1, g));
  EXPECT_NEAR(fit.a1 / a1, 1.0, 1e-9);
  EXPECT_NEAR(fit.b1 / b1, 1.0, 1e-9);
  EXPECT_NEAR(fit.g / g, 1.0, 1e-9);
  // Three points determine it too.
  const std::vector<double> three = {100, 300, 1000};
  const CostFit small = fit_quadratic(three, quadratic(three, a1, b1, g));
  EXPECT_NEAR(small.a1 / a1, 1.0, 1e-9);
  EXPECT_NEAR(small.b1 / b1, 1.0, 1e-9);
  EXPECT_NEAR(small.g / g, 1.0, 1e-9);
}

// A windowed layer (W = 1024): T(s) = a1 s^2 + b1 s + g up to the window and
// a1 (2 P(s) - s) + b1 s + g past it, with P(s) = 1024 x 1025 / 2 + (s - 1024) 1024
// the visible pairs. Fitting with the window gives the coefficients back; fitting the
// same times as if attention were quadratic misses them by far.
TEST(ProfilerFit, SlidingWindowFitsTheVisiblePairs) {
  const double a1 = 3.25e-9, b1 = 2.5e-6, g = 1.5e-4, W = 1024;
  std::vector<double> t;
  for (double s : kLengths) {
    const double square = s <= W ? s * s : 2 * (W * (W + 1) / 2 + (s - W) * W) - s;
    t.push_back(a1 * square + b1 * s + g);
  }
  const CostFit fit = fit_quadratic(kLengths, t, 1024);
  EXPECT_EQ(fit.window, 1024);
  EXPECT_NEAR(fit.a1 / a1, 1.0, 1e-9);
  EXPECT_NEAR(fit.b1 / b1, 1.0, 1e-9);
  EXPECT_NEAR(fit.g / g, 1.0, 1e-9);
  EXPECT_NEAR(fit(8192), t.back(), 1e-9 * t.back());
  EXPECT_LT(held_out_quadratic(kLengths, t, 1024).max, 1e-9);
  EXPECT_GT(held_out_quadratic(kLengths, t).max, 0.05);
}

TEST(ProfilerFit, LinearRecoversExactCoefficients) {
  std::vector<double> bytes;
  for (double s : kLengths) bytes.push_back(6848.0 * s + 512.0);
  const ActivationFit fit = fit_linear(kLengths, bytes);
  EXPECT_NEAR(fit.a2 / 6848.0, 1.0, 1e-12);
  EXPECT_NEAR(fit.b2 / 512.0, 1.0, 1e-9);
}

TEST(ProfilerFit, QuadraticWithinToleranceUnderMultiplicativeNoise) {
  // Each term matters over the range: at 8192 the s^2 term is ~70%, at 128 g is ~30%.
  const double a1 = 4e-9, b1 = 2e-6, g = 1e-4;
  const std::vector<double> exact = quadratic(kLengths, a1, b1, g);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(-0.02, 0.02);
  std::vector<double> noisy;
  for (double t : exact) noisy.push_back(t * (1 + noise(rng)));
  const CostFit fit = fit_quadratic(kLengths, noisy);
  EXPECT_NEAR(fit.a1 / a1, 1.0, 0.05);
  EXPECT_NEAR(fit.b1 / b1, 1.0, 0.2);
  EXPECT_NEAR(fit.g / g, 1.0, 0.3);
  for (size_t i = 0; i < kLengths.size(); ++i) EXPECT_NEAR(fit(kLengths[i]) / exact[i], 1.0, 0.03) << kLengths[i];
  // The held-out error is of the order of the noise.
  const RelativeError held = held_out_quadratic(kLengths, noisy);
  EXPECT_GT(held.max, 0.0);
  EXPECT_LT(held.max, 0.06);
}

TEST(ProfilerFit, CoefficientsStayNonNegative) {
  // Linear with a negative offset: the unconstrained fit has g < 0; the
  // constrained one sets g = 0 and keeps the rest non-negative.
  std::vector<double> t;
  for (double s : kLengths) t.push_back(1e-6 * s - 2e-5);
  const CostFit fit = fit_quadratic(kLengths, t);
  EXPECT_GE(fit.a1, 0.0);
  EXPECT_GT(fit.b1, 0.0);
  EXPECT_EQ(fit.g, 0.0);
  // Concave data (negative curvature): a1 clamps to 0.
  std::vector<double> concave;
  for (double s : kLengths) concave.push_back(1e-6 * s - 1e-11 * s * s + 1e-4);
  const CostFit c = fit_quadratic(kLengths, concave);
  EXPECT_EQ(c.a1, 0.0);
  EXPECT_GT(c.b1, 0.0);
  EXPECT_GE(c.g, 0.0);
}

TEST(ProfilerFit, RejectsTooFewOrInvalidPoints) {
  const std::vector<double> two = {1, 2};
  EXPECT_THROW(fit_quadratic(two, two), std::invalid_argument);
  const std::vector<double> same = {5, 5, 5, 5};
  EXPECT_THROW(fit_quadratic(same, same), std::invalid_argument);
  const std::vector<double> s = {1, 2, 3}, bad = {1, -2, 3};
  EXPECT_THROW(fit_quadratic(s, bad), std::invalid_argument);
  const std::vector<double> one = {7};
  EXPECT_THROW(fit_linear(one, one), std::invalid_argument);
  const std::vector<double> four = {1, 2, 3, 4};
  EXPECT_THROW(held_out_quadratic(four, four), std::invalid_argument);
}

TEST(ProfilerFit, RelativeErrorMaxAndMean) {
  const std::vector<double> s = {1, 2, 3}, t = {10, 20, 40};
  const RelativeError e = relative_error([](double x) { return 10 * x; }, s, t);
  EXPECT_EQ(e.points, 3);
  EXPECT_DOUBLE_EQ(e.max, 0.25);          // |30 - 40| / 40
  EXPECT_DOUBLE_EQ(e.mean, 0.25 / 3.0);   // 0, 0, 0.25
}

TEST(ProfilerFit, HeldOutFitsEvenIndicesAndEvaluatesOddOnes) {
  const double a1 = 2e-9, b1 = 1e-6, g = 5e-5;
  std::vector<double> t = quadratic(kLengths, a1, b1, g);
  // Noise-free: the held-out points are predicted exactly.
  EXPECT_LT(held_out_quadratic(kLengths, t).max, 1e-9);
  // Odd-indexed points 10% high, the even ones exact: the even fit is the true
  // quadratic, so every held-out point is off by 0.1 / 1.1.
  for (size_t i = 1; i < t.size(); i += 2) t[i] *= 1.1;
  const RelativeError e = held_out_quadratic(kLengths, t);
  EXPECT_EQ(e.points, static_cast<int64_t>(kLengths.size() / 2));
  EXPECT_NEAR(e.max, 0.1 / 1.1, 1e-9);
  EXPECT_NEAR(e.mean, 0.1 / 1.1, 1e-9);
}

TEST(ProfilerLengths, DefaultsInterleavePowersOfTwoAndMidpoints) {
  Config c;
  c.data.max_seq_len = 1024;
  c.data.micro_batch_tokens = 4096;  // not a document length: no effect
  EXPECT_EQ(default_profile_lengths(c), (std::vector<int64_t>{128, 181, 256, 362, 512, 724, 1024}));
  c.data.max_seq_len = 100000;
  const std::vector<int64_t> longest = default_profile_lengths(c);
  EXPECT_EQ(longest.back(), 8192);
  EXPECT_EQ(longest.front(), 128);
  c.data.max_seq_len = 300;
  EXPECT_EQ(default_profile_lengths(c), (std::vector<int64_t>{32, 45, 64, 91, 128, 181, 256}));
  const ProfileOptions startup = startup_profile_options(c);
  EXPECT_EQ(startup.lengths.size(), 5u);
  EXPECT_EQ(startup.lengths.back(), 256);
  c.data.max_seq_len = 4096;
  EXPECT_EQ(startup_profile_options(c).lengths, (std::vector<int64_t>{128, 181, 256, 362, 512}));
  EXPECT_THROW(validate_profile_lengths(std::vector<int64_t>{1, 2, 3, 4}), std::invalid_argument);
  EXPECT_THROW(validate_profile_lengths(std::vector<int64_t>{8, 16, 16, 32, 64}), std::invalid_argument);
  EXPECT_THROW(validate_profile_lengths(std::vector<int64_t>{1, 16, 24, 32, 64}), std::invalid_argument);
}

CostFile sample_file(const ModelConfig& m) {
  CostFile f;
  f.cost.a1 = 1.2345678901234567e-9;
  f.cost.b1 = 3.3e-6;
  f.cost.g = 1e-5;
  f.cost.a2 = 12345.0;
  f.cost.b2 = 640.0;
  f.cost.embedding_seconds_per_token = 2.5e-8;
  f.cost.head_seconds_per_token = 7.75e-6;
  f.cost.d2h_bytes_per_s = 9.5e9;
  f.cost.h2d_bytes_per_s = 8.25e9;
  CostProfileInfo& p = f.profiled;
  p.hidden_size = m.hidden_size;
  p.num_heads = m.num_heads;
  p.num_kv_heads = m.num_kv_heads;
  p.head_dim = m.head_dim();
  p.ffn_hidden_size = m.ffn_hidden_size;
  p.vocab_size = m.vocab_size;
  p.tp = 1;
  p.saved_floats_per_token = 1000;
  p.threads = 2;
  p.repeats = 5;
  p.gemm = "OpenBLAS 0.3.21 sgemm, Haswell kernels";
  p.host = "testhost";
  p.date = "2025-01-02T03:04:05Z";
  p.config = "configs/x.yaml";
  p.other_cpu_fraction = 0.25;
  f.fit.lengths = {128, 181, 256, 362, 512};
  f.fit.layer_seconds = {0.001, 0.0015, 0.002, 0.003, 0.0045};
  f.fit.activation_bytes = {1e6, 1.4e6, 2e6, 2.8e6, 4e6};
  f.fit.held_out_lengths = {181, 362};
  f.fit.held_out_max_relative_error = 0.0123;
  f.fit.held_out_mean_relative_error = 0.0061;
  f.fit.max_relative_error = 0.01;
  f.fit.activation_max_relative_error = 1e-4;
  f.fit.head_tokens = 512;
  f.fit.embedding_tokens = 4096;
  f.fit.copy_bytes = 64 << 20;
  return f;
}

TEST(CostFile, WriteReadRoundTrip) {
  const std::string dir = scratch_dir("profiler_round_trip");
  const ModelConfig m;
  const CostFile f = sample_file(m);
  const std::string path = dir + "/sub/cost.yaml";
  write_cost_file(path, f);
  const CostFile r = read_cost_file(path);
  EXPECT_EQ(r.cost.a1, f.cost.a1);
  EXPECT_EQ(r.cost.b1, f.cost.b1);
  EXPECT_EQ(r.cost.g, f.cost.g);
  EXPECT_EQ(r.cost.a2, f.cost.a2);
  EXPECT_EQ(r.cost.b2, f.cost.b2);
  EXPECT_EQ(r.cost.embedding_seconds_per_token, f.cost.embedding_seconds_per_token);
  EXPECT_EQ(r.cost.head_seconds_per_token, f.cost.head_seconds_per_token);
  EXPECT_EQ(r.cost.d2h_bytes_per_s, f.cost.d2h_bytes_per_s);
  EXPECT_EQ(r.cost.h2d_bytes_per_s, f.cost.h2d_bytes_per_s);
  EXPECT_EQ(r.profiled.hidden_size, f.profiled.hidden_size);
  EXPECT_EQ(r.profiled.num_heads, f.profiled.num_heads);
  EXPECT_EQ(r.profiled.num_kv_heads, f.profiled.num_kv_heads);
  EXPECT_EQ(r.profiled.head_dim, f.profiled.head_dim);
  EXPECT_EQ(r.profiled.ffn_hidden_size, f.profiled.ffn_hidden_size);
  EXPECT_EQ(r.profiled.vocab_size, f.profiled.vocab_size);
  EXPECT_EQ(r.profiled.tp, 1);
  EXPECT_EQ(r.profiled.saved_floats_per_token, 1000);
  EXPECT_EQ(r.profiled.threads, 2);
  EXPECT_EQ(r.profiled.repeats, 5);
  EXPECT_EQ(r.profiled.gemm, "OpenBLAS 0.3.21 sgemm, Haswell kernels");
  EXPECT_EQ(r.profiled.host, "testhost");
  EXPECT_EQ(r.profiled.date, "2025-01-02T03:04:05Z");
  EXPECT_EQ(r.profiled.config, "configs/x.yaml");
  EXPECT_EQ(r.profiled.other_cpu_fraction, 0.25);
  EXPECT_EQ(r.fit.lengths, f.fit.lengths);
  EXPECT_EQ(r.fit.layer_seconds, f.fit.layer_seconds);
  EXPECT_EQ(r.fit.activation_bytes, f.fit.activation_bytes);
  EXPECT_EQ(r.fit.held_out_lengths, f.fit.held_out_lengths);
  EXPECT_EQ(r.fit.held_out_max_relative_error, f.fit.held_out_max_relative_error);
  EXPECT_EQ(r.fit.held_out_mean_relative_error, f.fit.held_out_mean_relative_error);
  EXPECT_EQ(r.fit.max_relative_error, f.fit.max_relative_error);
  EXPECT_EQ(r.fit.activation_max_relative_error, f.fit.activation_max_relative_error);
  EXPECT_EQ(r.fit.head_tokens, 512);
  EXPECT_EQ(r.fit.embedding_tokens, 4096);
  EXPECT_EQ(r.fit.copy_bytes, 64 << 20);
}

std::string error_of(const std::string& path) {
  try {
    read_cost_file(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// Writes the sample file with one line replaced.
std::string edited_file(const std::string& dir, const std::string& name, const std::string& from, const std::string& to) {
  const std::string path = dir + "/" + name;
  write_cost_file(path, sample_file(ModelConfig{}));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  std::ofstream(path) << text;
  return path;
}

TEST(CostFile, ErrorsNameTheFileAndTheKey) {
  const std::string dir = scratch_dir("profiler_errors");
  const std::string missing = dir + "/none.yaml";
  EXPECT_NE(error_of(missing).find(missing), std::string::npos);

  const std::string no_a1 = edited_file(dir, "no_a1.yaml", "  a1:", "  x1:");
  std::string e = error_of(no_a1);
  EXPECT_NE(e.find(no_a1), std::string::npos) << e;
  EXPECT_NE(e.find("layer.a1: required key is missing"), std::string::npos) << e;

  const std::string negative = edited_file(dir, "negative.yaml", "  b1: ", "  b1: -");
  e = error_of(negative);
  EXPECT_NE(e.find(negative + ":"), std::string::npos) << e;
  EXPECT_NE(e.find("layer.b1: -3.3e-06"), std::string::npos) << e;
  EXPECT_NE(e.find("non-negative"), std::string::npos) << e;

  const std::string text = edited_file(dir, "text.yaml", "  d2h_bytes_per_s: ", "  d2h_bytes_per_s: fast #");
  e = error_of(text);
  EXPECT_NE(e.find("copy.d2h_bytes_per_s"), std::string::npos) << e;
  EXPECT_NE(e.find("'fast'"), std::string::npos) << e;

  const std::string format = edited_file(dir, "format.yaml", "format: hdp-trainer cost model", "format: other");
  e = error_of(format);
  EXPECT_NE(e.find("format"), std::string::npos) << e;

  const std::string config_file = dir + "/a_config.yaml";
  std::ofstream(config_file) << "model:\n  hidden_size: 128\n";
  e = error_of(config_file);
  EXPECT_NE(e.find(config_file), std::string::npos) << e;
  EXPECT_NE(e.find(config_file + ": format: required key is missing"), std::string::npos) << e;
}

Config config_with(const std::string& cost_file) {
  Config c;
  c.source = "configs/test.yaml";
  c.scheduler.cost_file = cost_file;
  return c;
}

// A cost file profiled on a windowed model records the window, reads it back into
// the cost model (whose s^2 term then follows the visible pairs), and is refused
// for a config with another window.
TEST(CostFile, SlidingWindowIsRecordedAndChecked) {
  const std::string dir = scratch_dir("profiler_window");
  Config c = config_with(dir + "/window.yaml");
  c.model.arch = "mistral";
  c.model.sliding_window = 256;
  CostFile f = sample_file(c.model);
  f.profiled.sliding_window = 256;
  write_cost_file(c.scheduler.cost_file, f);
  const CostFile r = read_cost_file(c.scheduler.cost_file);
  EXPECT_EQ(r.profiled.sliding_window, 256);
  EXPECT_EQ(r.cost.window, 256);
  const CostModel m = planner_cost_model(c, 1e10, 1000);
  EXPECT_EQ(m.window, 256);
  EXPECT_DOUBLE_EQ(m.compute_seconds(1024),
                   f.cost.a1 * (2 * (256.0 * 257 / 2 + 768.0 * 256) - 1024) + f.cost.b1 * 1024 + f.cost.g);
  c.model.sliding_window = 512;
  try {
    planner_cost_model(c, 1e10, 1000);
    FAIL() << "a cost file of another window was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window 256 vs 512"), std::string::npos) << e.what();
  }
  // A file without a window says nothing about one: full attention.
  write_cost_file(dir + "/full.yaml", sample_file(ModelConfig{}));
  EXPECT_EQ(read_cost_file(dir + "/full.yaml").cost.window, 0);
}

TEST(CostFile, AnotherModelShapeIsRefusedNamingBoth) {
  const std::string dir = scratch_dir("profiler_shape");
  ModelConfig other;
  other.hidden_size = 512;
  other.num_heads = 8;
  other.num_kv_heads = 4;
  other.ffn_hidden_size = 1376;
  const std::string path = dir + "/other.yaml";
  write_cost_file(path, sample_file(other));
  const Config c = config_with(path);  // the default model: hidden 128, 4 heads
  try {
    planner_cost_model(c, 1e10, 1000);
    FAIL() << "a cost file of another shape was accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("hidden_size 512 vs 128"), std::string::npos) << m;
    EXPECT_NE(m.find("num_heads 8 vs 4"), std::string::npos) << m;
    EXPECT_NE(m.find("ffn_hidden_size 1376 vs 352"), std::string::npos) << m;
    EXPECT_NE(m.find("configs/test.yaml"), std::string::npos) << m;
    EXPECT_NE(m.find("head_dim 64 vs 32"), std::string::npos) << m;
    EXPECT_EQ(m.find("num_kv_heads 4 vs"), std::string::npos) << m;  // equal: not among the differences
    EXPECT_EQ(m.find("vocab_size 258 vs"), std::string::npos) << m;
  }
  // The same shape is accepted.
  write_cost_file(path, sample_file(c.model));
  EXPECT_NO_THROW(planner_cost_model(c, 1e10, 1000));
}

TEST(CostFile, PlannerUsesTheFileScaledForTensorParallelism) {
  const std::string dir = scratch_dir("profiler_tp");
  Config c = config_with(dir + "/cost.yaml");
  const CostFile f = sample_file(c.model);
  write_cost_file(c.scheduler.cost_file, f);
  const CostModel one = planner_cost_model(c, 1e10, 1000);
  EXPECT_EQ(one.a1, f.cost.a1);
  EXPECT_EQ(one.b1, f.cost.b1);
  EXPECT_EQ(one.g, f.cost.g);
  EXPECT_EQ(one.a2, f.cost.a2);
  EXPECT_EQ(one.b2, f.cost.b2);
  EXPECT_EQ(one.head_seconds_per_token, f.cost.head_seconds_per_token);
  EXPECT_EQ(one.embedding_seconds_per_token, f.cost.embedding_seconds_per_token);
  EXPECT_EQ(one.d2h_bytes_per_s, f.cost.d2h_bytes_per_s);
  EXPECT_EQ(one.h2d_bytes_per_s, f.cost.h2d_bytes_per_s);
  // tp 2: times halve (embedding excepted), activations follow the rank's saved floats.
  c.parallel.tp = 2;
  const CostModel two = planner_cost_model(c, 1e10, 600);
  EXPECT_DOUBLE_EQ(two.a1, f.cost.a1 / 2);
  EXPECT_DOUBLE_EQ(two.b1, f.cost.b1 / 2);
  EXPECT_DOUBLE_EQ(two.g, f.cost.g / 2);
  EXPECT_DOUBLE_EQ(two.head_seconds_per_token, f.cost.head_seconds_per_token / 2);
  EXPECT_EQ(two.embedding_seconds_per_token, f.cost.embedding_seconds_per_token);
  EXPECT_DOUBLE_EQ(two.a2, f.cost.a2 * 0.6);
  EXPECT_DOUBLE_EQ(two.b2, f.cost.b2 * 0.6);
  EXPECT_EQ(two.d2h_bytes_per_s, f.cost.d2h_bytes_per_s);
}

TEST(CostFile, EmptyMeansDerivedFromFlops) {
  const Config c = config_with("");
  const CostModel a = planner_cost_model(c, 2e10, 900);
  const CostModel b = derived_cost_model(c, 2e10, 900);
  EXPECT_EQ(a.a1, b.a1);
  EXPECT_EQ(a.b1, b.b1);
  EXPECT_EQ(a.a2, 4.0 * 900);
  EXPECT_EQ(a.head_seconds_per_token, b.head_seconds_per_token);
}

// Expert parallelism's four row all-to-alls per token and layer, at the cost model's
// slower copy direction, and the planner that adds them and couples the ep group.
TEST(CostFile, ExpertParallelAllToAllsAreALayerTermPerToken) {
  Config c = config_with("");
  c.model.arch = "mixtral";
  c.model.hidden_size = 128;
  c.model.experts_per_token = 2;
  c.parallel.hdp = 2;
  CostModel cost = derived_cost_model(c, 2e10, 900);
  cost.d2h_bytes_per_s = 8e9;
  cost.h2d_bytes_per_s = 1e10;
  EXPECT_EQ(expert_all_to_all_seconds_per_token(c, cost), 0.0);  // ep 1: nothing leaves the rank
  c.parallel.ep = 2;
  // 4 all-to-alls x 2 experts x 128 values x 4 bytes (fp32) x 1/2 leave the rank:
  // 2048 bytes at 8 GB/s = 2.56e-7 s.
  EXPECT_DOUBLE_EQ(expert_all_to_all_seconds_per_token(c, cost), 2048 / 8e9);
  c.train.precision = DType::BF16;  // 2 bytes a value: half
  EXPECT_DOUBLE_EQ(expert_all_to_all_seconds_per_token(c, cost), 1024 / 8e9);
  c.train.precision = DType::F32;
  const StepPlanner planner(c, cost);
  EXPECT_DOUBLE_EQ(planner.settings().cost.b1, cost.b1 + 2048 / 8e9);
  EXPECT_EQ(planner.settings().ep, 2);
}

TEST(Profiler, StartupProfileOfATinyModelGivesAUsableModel) {
  Config c = config_with("profile");
  c.data.max_seq_len = 128;
  c.data.micro_batch_tokens = 128;
  const CostModel m = planner_cost_model(c, 1e10, 0);
  EXPECT_GE(m.a1, 0.0);
  EXPECT_GE(m.b1, 0.0);
  EXPECT_GE(m.g, 0.0);
  EXPECT_GT(m.compute_seconds(128), 0.0);
  EXPECT_GT(m.a2, 0.0);
  EXPECT_GT(m.head_seconds_per_token, 0.0);
  EXPECT_GT(m.embedding_seconds_per_token, 0.0);
  EXPECT_GT(m.d2h_bytes_per_s, 0.0);
  EXPECT_GT(m.h2d_bytes_per_s, 0.0);
}

// Poses as rank 0 of 2 whose peer measured `other` for every coefficient.
class PeerCommunicator final : public Communicator {
 public:
  explicit PeerCommunicator(double other) : other_(other) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  CommRequest all_reduce_async(Tensor, ReduceOp) override { throw std::logic_error("unused"); }
  CommRequest reduce_scatter_async(const Tensor&, Tensor) override { throw std::logic_error("unused"); }
  CommRequest all_gather_async(Tensor) override { throw std::logic_error("unused"); }
  CommRequest all_to_all_v_async(const Tensor&, std::span<const int64_t>, Tensor, std::span<const int64_t>) override {
    throw std::logic_error("unused");
  }
  CommRequest send_async(const Tensor&, int, int) override { throw std::logic_error("unused"); }
  CommRequest recv_async(Tensor, int, int) override { throw std::logic_error("unused"); }
  void all_reduce(std::span<double> values, ReduceOp op) override {
    EXPECT_EQ(op, ReduceOp::Sum);
    seen.assign(values.begin(), values.end());
    for (double& v : values) v += other_;
  }
  void all_reduce(std::span<int64_t>, ReduceOp) override { throw std::logic_error("unused"); }
  using Communicator::all_reduce;
  std::vector<double> seen;  // this rank's measurements

 private:
  double other_;
  std::string name_ = "world";
};

TEST(Profiler, StartupProfileIsAveragedOverTheRanks) {
  Config c = config_with("profile");
  c.data.max_seq_len = 64;
  PeerCommunicator world(1.0);
  const CostModel m = planner_cost_model(c, 1e10, 0, &world);
  ASSERT_EQ(world.seen.size(), 9u);  // one collective carrying every coefficient
  EXPECT_DOUBLE_EQ(m.a1, (world.seen[0] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.b1, (world.seen[1] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.g, (world.seen[2] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.a2, (world.seen[3] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.b2, (world.seen[4] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.d2h_bytes_per_s, (world.seen[5] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.h2d_bytes_per_s, (world.seen[6] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.embedding_seconds_per_token, (world.seen[7] + 1.0) / 2);
  EXPECT_DOUBLE_EQ(m.head_seconds_per_token, (world.seen[8] + 1.0) / 2);
}

TEST(Profiler, ActivationBytesAreTheLayersArena) {
  Config c;
  ProfileOptions o;
  o.lengths = {16, 24, 32, 48, 64};
  o.repeats = 1;
  o.head_tokens = 16;
  o.embedding_tokens = 16;
  o.copy_bytes = 1 << 16;
  const CostFile f = profile_cost_model(c, o);
  ASSERT_EQ(f.fit.activation_bytes.size(), 5u);
  // The arena holds 4 x saved floats per token per token, up to 64-byte alignment of 13 tensors.
  for (size_t i = 0; i < o.lengths.size(); ++i) {
    const double exact = 4.0 * static_cast<double>(f.profiled.saved_floats_per_token * o.lengths[i]);
    EXPECT_GE(f.fit.activation_bytes[i], exact);
    EXPECT_LE(f.fit.activation_bytes[i], exact + 13 * 64);
  }
  EXPECT_EQ(f.profiled.hidden_size, c.model.hidden_size);
  EXPECT_EQ(f.profiled.tp, 1);
  EXPECT_EQ(f.fit.held_out_lengths, (std::vector<int64_t>{24, 48}));
  EXPECT_TRUE(std::isfinite(f.fit.held_out_max_relative_error));
  EXPECT_FALSE(describe_cost_file(f).empty());
}

// ---- trainer profile ----

std::string tiny_config() { return std::string(HDP_SOURCE_DIR) + "/configs/tiny-llama.yaml"; }

TEST(ProfileCommand, WritesACostFileForATinyConfig) {
  const std::string dir = scratch_dir("profiler_cli");
  const std::string out = dir + "/cost.yaml";
  // No data file is needed: the config's data.path need not exist.
  const auto r = run_trainer("profile " + tiny_config() + " --set data.path=" + dir +
                             "/absent.h5 --lengths 64,91,128,181,256 --repeats 2 --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("held-out"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(out), std::string::npos) << r.output;
  const CostFile f = read_cost_file(out);
  // Non-negative by construction; which of them is positive depends on the timings
  // (a busy machine can flatten a small model's curve to g alone).
  EXPECT_GE(f.cost.a1, 0.0);
  EXPECT_GE(f.cost.b1, 0.0);
  EXPECT_GE(f.cost.g, 0.0);
  EXPECT_GT(f.cost.compute_seconds(64), 0.0);
  EXPECT_GT(f.cost.a2, 0.0);
  EXPECT_GT(f.cost.embedding_seconds_per_token, 0.0);
  EXPECT_GT(f.cost.head_seconds_per_token, 0.0);
  EXPECT_GT(f.cost.d2h_bytes_per_s, 0.0);
  EXPECT_GT(f.cost.h2d_bytes_per_s, 0.0);
  EXPECT_TRUE(std::isfinite(f.fit.held_out_max_relative_error));
  EXPECT_TRUE(std::isfinite(f.fit.held_out_mean_relative_error));
  EXPECT_LE(f.fit.held_out_mean_relative_error, f.fit.held_out_max_relative_error);
  EXPECT_EQ(f.fit.lengths, (std::vector<int64_t>{64, 91, 128, 181, 256}));
  EXPECT_EQ(f.fit.held_out_lengths, (std::vector<int64_t>{91, 181}));
  EXPECT_EQ(f.fit.layer_seconds.size(), 5u);
  EXPECT_EQ(f.profiled.hidden_size, 128);
  EXPECT_EQ(f.profiled.vocab_size, 258);
  EXPECT_EQ(f.profiled.repeats, 2);
  EXPECT_GT(f.profiled.threads, 0);
  EXPECT_FALSE(f.profiled.date.empty());
  EXPECT_NE(f.profiled.gemm.find(" sgemm, "), std::string::npos) << f.profiled.gemm;
}

TEST(ProfileCommand, DefaultOutputIsInTheRunDirectory) {
  const std::string dir = scratch_dir("profiler_cli_default");
  const auto r = run_trainer("profile " + tiny_config() + " --set train.run_dir=" + dir +
                             " --lengths 32,45,64,91,128 --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/cost-model.yaml")) << r.output;
}

TEST(ProfileCommand, BadUsageExitsWithTwo) {
  const std::string dir = scratch_dir("profiler_cli_bad");
  const std::string out = " --output " + dir + "/c.yaml";
  const std::string cfg = tiny_config();
  auto r = run_trainer("profile" + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("CONFIG.yaml"), std::string::npos) << r.output;
  r = run_trainer("profile " + cfg + " --lengths 64,128,256" + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("at least 5"), std::string::npos) << r.output;
  r = run_trainer("profile " + cfg + " --lengths 64,abc,128,256,512" + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("abc"), std::string::npos) << r.output;
  r = run_trainer("profile " + cfg + " --repeats 0" + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_trainer("profile " + cfg + " --bogus" + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--bogus"), std::string::npos) << r.output;
  r = run_trainer("profile " + dir + "/missing.yaml" + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing.yaml"), std::string::npos) << r.output;
  r = run_trainer("profile " + cfg + " --set model.num_heads=0" + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.num_heads"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/c.yaml"));
  r = run_trainer("profile --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--lengths"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hdp
