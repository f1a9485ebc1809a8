// Configuration loading: values, defaults, --set overrides, the error messages
// (file:line, key path, hint) and the round trip through Config::yaml.

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "parallel/nccl_communicator.h"
#include "config/config.h"

namespace hdp {
namespace {

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected the text to contain\n  " << part << "\nbut it is\n  " << text;
}
#define EXPECT_CONTAINS(text, part) EXPECT_TRUE(Contains((text), (part)))

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  return path;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size()))
    text.replace(pos, from.size(), to);
  return text;
}

// A scratch directory with an empty dummy data file and config files written
// on demand; "DATA" in a config text stands for the dummy file's path.
struct Scratch {
  std::string dir;
  std::string data;
  std::string checkpoint;  // an (empty) checkpoint directory for train.init_from
  explicit Scratch(const std::string& name) : dir(hdp::testing::scratch_dir("config_test_" + name)) {
    data = write_file(dir + "/corpus.h5", "");
    checkpoint = dir + "/step-00000001";
    std::filesystem::create_directories(checkpoint);
  }
  std::string config(const std::string& text, const std::string& name = "run.yaml") const {
    return write_file(dir + "/" + name, replace_all(replace_all(text, "DATA", data), "CKPT", checkpoint));
  }
};

// Runs `fn`, which must throw ConfigError; returns the message.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ConfigError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ConfigError, nothing was thrown";
  return "";
}

std::string load_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { load_config(path, overrides); });
}

void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.model.arch, b.model.arch);
  EXPECT_EQ(a.model.sliding_window, b.model.sliding_window);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.hidden_size, b.model.hidden_size);
  EXPECT_EQ(a.model.num_layers, b.model.num_layers);
  EXPECT_EQ(a.model.num_heads, b.model.num_heads);
  EXPECT_EQ(a.model.num_kv_heads, b.model.num_kv_heads);
  EXPECT_EQ(a.model.ffn_hidden_size, b.model.ffn_hidden_size);
  EXPECT_EQ(a.model.rope_theta, b.model.rope_theta);
  EXPECT_EQ(a.model.norm_eps, b.model.norm_eps);
  EXPECT_EQ(a.model.tie_embeddings, b.model.tie_embeddings);
  EXPECT_EQ(a.model.init_std, b.model.init_std);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.data.format, b.data.format);
  EXPECT_EQ(a.data.max_seq_len, b.data.max_seq_len);
  EXPECT_EQ(a.data.global_batch_tokens, b.data.global_batch_tokens);
  EXPECT_EQ(a.data.micro_batch_tokens, b.data.micro_batch_tokens);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.data.seed, b.data.seed);
  EXPECT_EQ(a.optim.lr, b.optim.lr);
  EXPECT_EQ(a.optim.min_lr, b.optim.min_lr);
  EXPECT_EQ(a.optim.warmup_steps, b.optim.warmup_steps);
  EXPECT_EQ(a.optim.weight_decay, b.optim.weight_decay);
  EXPECT_EQ(a.optim.beta1, b.optim.beta1);
  EXPECT_EQ(a.optim.beta2, b.optim.beta2);
  EXPECT_EQ(a.optim.eps, b.optim.eps);
  EXPECT_EQ(a.optim.grad_clip, b.optim.grad_clip);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.log_every, b.train.log_every);
  EXPECT_EQ(a.train.run_dir, b.train.run_dir);
  EXPECT_EQ(a.train.checkpoint_every, b.train.checkpoint_every);
  EXPECT_EQ(a.train.checkpoint_dir, b.train.checkpoint_dir);
  EXPECT_EQ(a.train.keep_checkpoints, b.train.keep_checkpoints);
  EXPECT_EQ(a.train.resume, b.train.resume);
  EXPECT_EQ(a.train.init_from, b.train.init_from);
  EXPECT_EQ(a.train.peak_flops, b.train.peak_flops);
  EXPECT_EQ(a.train.spike_factor, b.train.spike_factor);
  EXPECT_EQ(a.train.max_bad_steps, b.train.max_bad_steps);
  EXPECT_EQ(a.train.threads, b.train.threads);
  EXPECT_EQ(a.parallel.tp, b.parallel.tp);
  EXPECT_EQ(a.parallel.pp, b.parallel.pp);
  EXPECT_EQ(a.parallel.hdp, b.parallel.hdp);
}

// Every key set to a non-default value. Line numbers matter to the tests.
const char* kFullConfig =
    "# full config\n"                      // 1
    "model:\n"                             // 2
    "  arch: llama\n"                      // 3
    "  vocab_size: 512\n"                  // 4
    "  hidden_size: 96\n"                  // 5
    "  num_layers: 3\n"                    // 6
    "  num_heads: 6\n"                     // 7
    "  num_kv_heads: 2\n"                  // 8
    "  ffn_hidden_size: 256\n"             // 9
    "  rope_theta: 500000.0\n"             // 10
    "  norm_eps: 1e-6\n"                   // 11
    "  tie_embeddings: true\n"             // 12
    "  init_std: 0.01\n"                   // 13
    "data:\n"                              // 14
    "  path: DATA\n"                       // 15
    "  format: hdf5\n"                     // 16
    "  max_seq_len: 256\n"                 // 17
    "  global_batch_tokens: 8192\n"        // 18
    "  micro_batch_tokens: 1024\n"         // 19
    "  shuffle: false\n"                   // 20
    "  seed: 99\n"                         // 21
    "optim:\n"                             // 22
    "  lr: 2e-3\n"                         // 23
    "  min_lr: 2.0e-4\n"                   // 24
    "  warmup_steps: 20\n"                 // 25
    "  weight_decay: 0.05\n"               // 26
    "  beta1: 0.8\n"                       // 27
    "  beta2: 0.99\n"                      // 28
    "  eps: 1e-10\n"                       // 29
    "  grad_clip: 0.5\n"                   // 30
    "train:\n"                             // 31
    "  steps: 200\n"                       // 32
    "  seed: 7\n"                          // 33
    "  log_every: 5\n"                     // 34
    "  run_dir: runs/x\n"                  // 35
    "  checkpoint_every: 50\n"             // 36
    "  checkpoint_dir: runs/x/ckpt\n"      // 37
    "  keep_checkpoints: 2\n"              // 38
    "  resume: never\n"                    // 39
    "  init_from: CKPT\n"                  // 40
    "  peak_flops: 1.5e12\n"               // 41
    "  threads: 2\n"                       // 42
    "parallel:\n"                          // 43
    "  tp: 1\n"                            // 44
    "  pp: 1\n"                            // 45
    "  hdp: 1\n";                          // 46

const char* kMinimalConfig =
    "data:\n"
    "  path: DATA\n";

TEST(Config, FullConfigParsesExactValues) {
  Scratch s("full");
  const std::string path = s.config(kFullConfig);
  const Config c = load_config(path);
  EXPECT_EQ(c.model.arch, "llama");
  EXPECT_EQ(c.model.vocab_size, 512);
  EXPECT_EQ(c.model.hidden_size, 96);
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_EQ(c.model.num_heads, 6);
  EXPECT_EQ(c.model.num_kv_heads, 2);
  EXPECT_EQ(c.model.head_dim(), 16);
  EXPECT_EQ(c.model.ffn_hidden_size, 256);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_EQ(c.model.norm_eps, 1e-6);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.init_std, 0.01);
  EXPECT_EQ(c.data.path, s.data);
  EXPECT_EQ(c.data.format, "hdf5");
  EXPECT_EQ(c.data.max_seq_len, 256);
  EXPECT_EQ(c.data.global_batch_tokens, 8192);
  EXPECT_EQ(c.data.micro_batch_tokens, 1024);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.data.seed, 99u);
  EXPECT_EQ(c.optim.lr, 2e-3);
  EXPECT_EQ(c.optim.min_lr, 2e-4);
  EXPECT_EQ(c.optim.warmup_steps, 20);
  EXPECT_EQ(c.optim.weight_decay, 0.05);
  EXPECT_EQ(c.optim.beta1, 0.8);
  EXPECT_EQ(c.optim.beta2, 0.99);
  EXPECT_EQ(c.optim.eps, 1e-10);
  EXPECT_EQ(c.optim.grad_clip, 0.5);
  EXPECT_EQ(c.train.steps, 200);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.train.log_every, 5);
  EXPECT_EQ(c.train.run_dir, "runs/x");
  EXPECT_EQ(c.train.checkpoint_every, 50);
  EXPECT_EQ(c.train.checkpoint_dir, "runs/x/ckpt");
  EXPECT_EQ(c.train.keep_checkpoints, 2);
  EXPECT_EQ(c.train.resume, ResumeMode::Never);
  EXPECT_EQ(c.train.init_from, s.checkpoint);
  EXPECT_EQ(c.train.peak_flops, 1.5e12);
  EXPECT_EQ(c.train.threads, 2);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.parallel.pp, 1);
  EXPECT_EQ(c.parallel.hdp, 1);
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.origins.at("model.num_heads"), path + ":7");
  EXPECT_EQ(c.origins.at("parallel.hdp"), path + ":46");
  EXPECT_EQ(c.origins.at("model"), path + ":2");
  EXPECT_EQ(c.origins.size(), 45u);  // 40 keys and 5 section headers
}

TEST(Config, DefaultsForEverythingButDataPath) {
  Scratch s("defaults");
  const Config c = load_config(s.config(kMinimalConfig));
  Config expected;
  expected.data.path = s.data;
  expect_same(c, expected);
  // The struct defaults, spelled out so that a changed default is noticed.
  EXPECT_EQ(c.model.vocab_size, 258);
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.data.max_seq_len, 1024);
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.train.resume, ResumeMode::Auto);
  EXPECT_EQ(c.train.init_from, "");
  EXPECT_EQ(c.train.spike_factor, 3.0);
  EXPECT_EQ(c.train.grad_norm_spike_factor, 100.0);
  EXPECT_FALSE(c.train.start_over);
  EXPECT_EQ(c.origins.size(), 2u);  // data and data.path
}

// What the ranks compare at start-up (run/job.cpp): the keys whose lines differ
// between two effective configs, with both values.
TEST(Config, DifferencesNameEveryKeyWhoseValueDiffers) {
  Scratch s("differences");
  const Config a = load_config(s.config(kMinimalConfig));
  const Config b = load_config(s.config(kMinimalConfig), {"optim.lr=0.003", "model.hidden_size=256"});
  const std::vector<ConfigDifference> d = config_differences(b.yaml, a.yaml);
  ASSERT_EQ(d.size(), 2u) << b.yaml;
  EXPECT_EQ(d[0].key, "model.hidden_size");
  EXPECT_EQ(d[0].value, "256");
  EXPECT_EQ(d[0].other_value, "128");
  EXPECT_EQ(d[1].key, "optim.lr");
  EXPECT_EQ(d[1].value, "0.003");
  EXPECT_EQ(d[1].other_value, "0.0003");
  EXPECT_TRUE(config_differences(a.yaml, a.yaml).empty());
  const std::vector<ConfigDifference> missing = config_differences("model:\n  arch: \"llama\"\n", "model:\n  arch: "
                                                                   "\"llama\"\ntrain:\n  steps: 3\n");
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].key, "train.steps");
  EXPECT_EQ(missing[0].value, "(absent)");
  EXPECT_EQ(missing[0].other_value, "3");
}

TEST(Config, EmptySectionsAndBooleanSpellings) {
  Scratch s("empty_sections");
  const Config c = load_config(s.config(
      "model:\n"
      "optim: {}\n"
      "data:\n"
      "  path: DATA\n"
      "  shuffle: no\n"
      "train:\n"
      "  init_from: ~\n"));
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.train.init_from, "");
  EXPECT_EQ(c.model.hidden_size, 128);
  const Config d = load_config(s.config("data: {path: DATA, shuffle: Yes}\n", "flow.yaml"));
  EXPECT_TRUE(d.data.shuffle);
}

TEST(Config, OverridesAreAppliedInOrder) {
  Scratch s("overrides");
  const std::string path = s.config(kFullConfig);
  const Config c = load_config(path, {
                                         "model.hidden_size=192",        // int
                                         "optim.lr=5e-4",                // float
                                         "model.tie_embeddings=false",   // bool
                                         "train.resume=auto",            // string
                                         "train.run_dir=runs/a b",       // string with a space
                                         "model.num_heads=4",
                                         "model.num_heads=12",           // later wins
                                         "train.init_from=",             // empty string
                                         "data.seed=18446744073709551615",
                                         " parallel.tp = 1",             // spaces around the key
                                     });
  EXPECT_EQ(c.model.hidden_size, 192);
  EXPECT_EQ(c.optim.lr, 5e-4);
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_EQ(c.train.resume, ResumeMode::Auto);
  EXPECT_EQ(c.train.run_dir, "runs/a b");
  EXPECT_EQ(c.model.num_heads, 12);
  EXPECT_EQ(c.train.init_from, "");
  EXPECT_EQ(c.data.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(c.model.vocab_size, 512);  // untouched keys keep the file's values
  EXPECT_EQ(c.origins.at("model.num_heads"), "--set model.num_heads=12");
  EXPECT_EQ(c.origins.at("model.vocab_size"), path + ":4");
  // Overrides are in the effective YAML.
  EXPECT_CONTAINS(c.yaml, "hidden_size: 192");
  EXPECT_CONTAINS(c.yaml, "num_heads: 12");
}

TEST(Config, OverrideCanFixAFileValueAndBreakIt) {
  Scratch s("override_validation");
  // The file alone is invalid (6 heads do not divide 128) but the override fixes it:
  // validation runs after the overrides.
  const std::string path = s.config(
      "model:\n"
      "  num_heads: 6\n"
      "data:\n"
      "  path: DATA\n");
  EXPECT_EQ(load_config(path, {"model.num_heads=8", "model.num_kv_heads=2"}).model.num_heads, 8);
  // An override's bad value is reported at the override.
  const std::string msg = load_error(s.config(kMinimalConfig, "min.yaml"), {"model.num_heads=6"});
  EXPECT_EQ(msg, "--set model.num_heads=6: model.num_heads: 6 does not divide model.hidden_size 128 (default); "
                 "choose a divisor of 128");
}

TEST(ConfigErrors, UnknownKeySuggestsTheClosest) {
  Scratch s("unknown_key");
  const std::string path = s.config(
      "model:\n"
      "  vocab_size: 258\n"
      "  hiden_size: 64\n"
      "data:\n"
      "  path: DATA\n");
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":3: model.hiden_size: unknown key in section 'model'");
  EXPECT_CONTAINS(msg, "did you mean 'hidden_size'?");
  EXPECT_CONTAINS(msg, "valid keys in model: arch, vocab_size, hidden_size, num_layers, num_heads, "
                             "num_kv_heads, ffn_hidden_size, rope_theta, rope_scaling, rope_scaling_factor, "
                             "rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions, norm_eps, "
                             "tie_embeddings, init_std, sliding_window, num_experts, experts_per_token, "
                             "router_aux_loss_coef");
}

TEST(ConfigErrors, UnknownKeyFarFromAnyHasNoSuggestion) {
  Scratch s("unknown_key_far");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "  compression: gzip\n");
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":3: data.compression: unknown key in section 'data'");
  EXPECT_CONTAINS(msg, "valid keys in data: path, format, max_seq_len");
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
}

TEST(ConfigErrors, UnknownSection) {
  Scratch s("unknown_section");
  std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "modle:\n"
      "  hidden_size: 64\n");
  std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":3: modle: unknown section");
  EXPECT_CONTAINS(msg, "did you mean 'model'?");
  EXPECT_CONTAINS(msg, "valid sections: model, data, optim, train, parallel");

  // A key written at the top level points to its section.
  path = s.config("lr: 0.1\n", "toplevel.yaml");
  msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":1: lr: unknown section");
  EXPECT_CONTAINS(msg, "did you mean 'optim.lr'?");
}

TEST(ConfigErrors, WrongTypes) {
  Scratch s("wrong_type");
  struct Case {
    std::string line;     // goes into the model/data/train section below
    std::string section;
    std::string key;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"hidden_size: abc", "model", "model.hidden_size", "expected an integer, got 'abc'; write a whole number"},
      {"hidden_size: 1.5", "model", "model.hidden_size", "expected an integer, got '1.5'"},
      {"hidden_size: \"128\"", "model", "model.hidden_size",
       "expected an integer, got the quoted string \"128\" (remove the quotes)"},
      {"hidden_size: [1, 2]", "model", "model.hidden_size", "expected an integer, got a list"},
      {"hidden_size:", "model", "model.hidden_size", "expected an integer, got nothing (null)"},
      {"hidden_size: 99999999999999999999", "model", "model.hidden_size", "is out of range"},
      {"hdp: 3000000000", "parallel", "parallel.hdp", "is out of range; the value must fit a 32-bit signed integer"},
      {"tie_embeddings: maybe", "model", "model.tie_embeddings",
       "expected true or false, got 'maybe'; write true or false"},
      {"rope_theta: fast", "model", "model.rope_theta", "expected a number, got 'fast'"},
      {"rope_theta: .nan", "model", "model.rope_theta", "expected a number"},
      {"seed: -1", "train", "train.seed", "expected a non-negative integer, got '-1'"},
      {"run_dir: {a: 1}", "train", "train.run_dir", "expected a string, got a mapping"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line);
    std::string text = "data:\n  path: DATA\n" + c.section + ":\n  " + c.line + "\n";
    if (c.section == "data") text = "data:\n  path: DATA\n  " + c.line + "\n";
    const std::string path = s.config(text);
    const std::string msg = load_error(path);
    EXPECT_CONTAINS(msg, path + ":4: " + c.key + ": ");
    EXPECT_CONTAINS(msg, c.expected);
  }
  // A section that is not a mapping.
  const std::string path = s.config("data:\n  path: DATA\noptim: 0.1\n", "section.yaml");
  EXPECT_CONTAINS(load_error(path), path + ":3: optim: expected a mapping of keys, got '0.1'");
}

TEST(ConfigErrors, NonPositiveValues) {
  Scratch s("non_positive");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "model:\n"
      "  num_layers: 0\n");
  EXPECT_EQ(load_error(path), path + ":4: model.num_layers: 0 is not positive; it must be at least 1");
  EXPECT_EQ(load_error(s.config(kMinimalConfig, "min.yaml"), {"optim.eps=-1e-8"}),
            "--set optim.eps=-1e-8: optim.eps: -1e-08 is not positive; it must be greater than 0");
}

TEST(ConfigErrors, HeadsMustDivideHidden) {
  Scratch s("heads_divide");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "model:\n"
      "  hidden_size: 128\n"
      "  num_kv_heads: 1\n"
      "  # the next line is the culprit\n"
      "  num_heads: 6\n");
  EXPECT_EQ(load_error(path),
            path + ":7: model.num_heads: 6 does not divide model.hidden_size 128; choose a divisor of 128");
}

TEST(ConfigErrors, KvHeadsMustDivideHeads) {
  Scratch s("kv_heads_divide");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "model:\n"
      "  num_heads: 8\n"
      "  num_kv_heads: 3\n");
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":5: model.num_kv_heads: 3 does not divide model.num_heads 8; "
                                    "choose a divisor of 8");
}

TEST(ConfigErrors, CrossFieldErrorWithADefaultPointsAtTheKeyThatWasSet) {
  Scratch s("cross_default");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "model:\n"
      "  num_heads: 6\n"
      "  hidden_size: 96\n");
  // num_kv_heads keeps its default 4, which does not divide the 6 heads set on line 4.
  EXPECT_EQ(load_error(path), path + ":4: model.num_kv_heads: 4 (default) does not divide model.num_heads 6; "
                                     "choose a divisor of 6 (grouped-query attention shares each KV head "
                                     "among num_heads/num_kv_heads query heads)");
}

TEST(ConfigErrors, HeadDimMustBeEven) {
  Scratch s("head_dim_even");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "model:\n"
      "  hidden_size: 36\n"
      "  num_heads: 4\n"
      "  num_kv_heads: 2\n");
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":5: model.num_heads: head dimension model.hidden_size/model.num_heads = "
                                    "36/4 = 9 is odd; RoPE rotates pairs");
}

TEST(ConfigErrors, OtherConstraints) {
  Scratch s("other_constraints");
  const std::string path = s.config(kMinimalConfig);
  struct Case {
    std::string override_;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"model.arch=gpt2", "model.arch: unsupported architecture 'gpt2'; choose 'llama', 'mistral' or 'mixtral'"},
      {"data.format=bin", "data.format: unsupported dataset format 'bin'; choose hdf5 (this trainer's file) or megatron"},
      {"data.max_seq_len=1", "data.max_seq_len: 1 is too small; it must be at least 2"},
      {"data.micro_batch_tokens=0", "data.micro_batch_tokens: 0 is not positive"},
      {"scheduler.policy=random", "scheduler.policy: unknown policy 'random'; choose naive"},
      {"scheduler.cp=-1", "scheduler.cp: -1 is negative"},
      {"offload.ratio=1.5", "offload.ratio: 1.5 is above 1"},
      {"offload.bandwidth_gbs=0", "offload.bandwidth_gbs: 0 is not positive"},
      {"data.global_batch_tokens=1000", "data.global_batch_tokens: 1000 is smaller than data.max_seq_len 1024"},
      {"optim.lr=0", "optim.lr: 0 is not positive"},
      {"optim.min_lr=0.01", "optim.min_lr: 0.01 is larger than optim.lr 0.0003 (default); choose 0 <= min_lr <= 0.0003 (the schedule decays from lr to min_lr)"},
      {"optim.min_lr=-1", "optim.min_lr: -1 is negative"},
      {"optim.warmup_steps=-1", "optim.warmup_steps: -1 is negative"},
      {"optim.weight_decay=-0.1", "optim.weight_decay: -0.1 is negative"},
      {"optim.beta1=1", "optim.beta1: 1 is outside [0, 1); choose 0 <= beta1 < 1"},
      {"optim.beta2=-0.5", "optim.beta2: -0.5 is outside [0, 1)"},
      {"optim.grad_clip=-1", "optim.grad_clip: -1 is negative; it must be 0 or more (0 disables clipping)"},
      {"train.steps=0", "train.steps: 0 is not positive"},
      {"train.log_every=0", "train.log_every: 0 is not positive"},
      {"train.checkpoint_every=-5", "train.checkpoint_every: -5 is negative"},
      {"train.keep_checkpoints=0", "train.keep_checkpoints: 0 is less than 1"},
      {"train.resume=always", "train.resume: unknown mode 'always'; choose auto"},
      {"train.device=tpu", "train.device: unknown device 'tpu'; choose cpu, cuda or guarded (test-only)"},
      {"scheduler.balance=tp", "scheduler.balance: unknown balance mode 'tp'; choose dp"},
      {"loader.mode=far", "loader.mode: unknown mode 'far'; choose local"},
      {"train.threads=-1", "train.threads: -1 is not between 0 and 1024"},
      {"train.threads=100000", "train.threads: 100000 is not between 0 and 1024; choose 0 (the node's cores / its "
                               "ranks) or a thread count up to 1024"},
      {"train.grad_norm_spike_factor=1", "train.grad_norm_spike_factor: 1 is not 0 or above 1"},
      {"model.num_layers=1000000000", "model.num_layers: 1000000000 is above 65536; this build supports at most 65536"},
      {"train.peak_flops=-1", "train.peak_flops: -1 is negative"},
      {"train.spike_factor=0.5", "train.spike_factor: 0.5 is not 0 or above 1"},
      {"train.max_bad_steps=0", "train.max_bad_steps: 0 is less than 1"},
      {"train.run_dir=", "train.run_dir: is empty"},
      {"model.norm_eps=0", "model.norm_eps: 0 is not positive"},
      {"model.init_std=0", "model.init_std: 0 is not positive"},
      {"model.rope_theta=-1", "model.rope_theta: -1 is not positive"},
      {"model.ffn_hidden_size=0", "model.ffn_hidden_size: 0 is not positive"},
      {"model.vocab_size=-3", "model.vocab_size: -3 is not positive"},
      {"parallel.tp=0", "parallel.tp: 0 is not positive"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.override_);
    EXPECT_CONTAINS(load_error(path, {c.override_}), "--set " + c.override_ + ": " + c.expected);
  }
}

// model.sliding_window as Hugging Face configs have it: a positive integer or null
// on mistral, absent (null) on llama.
TEST(Config, SlidingWindow) {
  Scratch s("sliding_window");
  const Config d = load_config(s.config(kMinimalConfig));
  EXPECT_FALSE(d.model.sliding_window.has_value());
  EXPECT_EQ(d.model.attention_window(), 0);
  EXPECT_EQ(d.model.shape().window, 0);
  EXPECT_CONTAINS(d.yaml, "sliding_window: ~");

  const std::string path = s.config(
      "model:\n"
      "  arch: mistral\n"
      "  sliding_window: 96\n"
      "data:\n"
      "  path: DATA\n",
      "mistral.yaml");
  const Config m = load_config(path);
  EXPECT_EQ(m.model.arch, "mistral");
  ASSERT_TRUE(m.model.sliding_window.has_value());
  EXPECT_EQ(*m.model.sliding_window, 96);
  EXPECT_EQ(m.model.attention_window(), 96);
  EXPECT_EQ(m.model.shape().window, 96);
  EXPECT_CONTAINS(m.yaml, "sliding_window: 96");
  const Config back = parse_config_text(m.yaml, "stored", {}, false);
  expect_same(back, m);
  EXPECT_EQ(back.yaml, m.yaml);

  // null on mistral: full attention (Mistral 7B v0.2 and later), also from --set.
  const Config full = load_config(path, {"model.sliding_window=null"});
  EXPECT_FALSE(full.model.sliding_window.has_value());
  const Config full_back = parse_config_text(full.yaml, "stored", {}, false);
  EXPECT_FALSE(full_back.model.sliding_window.has_value());
  EXPECT_EQ(full_back.yaml, full.yaml);

  EXPECT_CONTAINS(load_error(path, {"model.sliding_window=0"}),
                  "--set model.sliding_window=0: model.sliding_window: 0 is not positive; it must be at least 1");
  EXPECT_CONTAINS(load_error(path, {"model.sliding_window=-4"}), "model.sliding_window: -4 is not positive");
  EXPECT_CONTAINS(load_error(path, {"model.sliding_window=4294967296"}),
                  "model.sliding_window: 4294967296 is too large");
  EXPECT_CONTAINS(load_error(path, {"model.sliding_window=wide"}), "model.sliding_window");
  // A window on llama is refused at the line that set it.
  const std::string llama = s.config(
      "model:\n"
      "  arch: llama\n"
      "  sliding_window: 64\n"
      "data:\n"
      "  path: DATA\n",
      "llama.yaml");
  EXPECT_CONTAINS(load_error(llama), llama + ":3: model.sliding_window: a sliding window needs model.arch "
                                             "'mistral' or 'mixtral', not 'llama'; set model.arch: mistral");
}

// model.arch: mixtral with its keys (Hugging Face's defaults), and the settings it
// does not support yet refused at start-up naming the key.
TEST(Config, Mixtral) {
  Scratch s("mixtral");
  const std::string path = s.config(
      "model:\n"
      "  arch: mixtral\n"
      "  num_experts: 4\n"
      "  experts_per_token: 2\n"
      "  router_aux_loss_coef: 0.02\n"
      "data:\n"
      "  path: DATA\n"
      "  max_seq_len: 512\n"
      "  micro_batch_tokens: 2048\n",
      "mixtral.yaml");
  const Config c = load_config(path);
  EXPECT_TRUE(c.model.moe());
  EXPECT_EQ(c.model.num_experts, 4);
  EXPECT_EQ(c.model.experts_per_token, 2);
  EXPECT_EQ(c.model.router_aux_loss_coef, 0.02);
  EXPECT_EQ(c.model.shape().experts, 4);
  EXPECT_EQ(c.model.shape().experts_per_token, 2);
  const Config back = parse_config_text(c.yaml, "stored", {}, false);
  EXPECT_EQ(back.model.num_experts, 4);
  EXPECT_EQ(back.yaml, c.yaml);
  const Config d = load_config(s.config(kMinimalConfig));
  EXPECT_EQ(d.model.num_experts, 8);
  EXPECT_EQ(d.model.experts_per_token, 2);
  EXPECT_EQ(d.model.router_aux_loss_coef, 0.001);
  EXPECT_EQ(d.model.shape().experts, 1);  // llama: the keys are not used

  const std::vector<std::pair<std::string, std::string>> refused = {
      {"model.experts_per_token=5", "model.experts_per_token: 5 is outside [1, model.num_experts = 4]"},
      {"model.num_experts=0", "model.num_experts: 0 is not positive"},
      {"model.router_aux_loss_coef=-1", "model.router_aux_loss_coef: -1 is negative"},
  };
  for (const auto& [override_, expected] : refused) {
    SCOPED_TRACE(override_);
    EXPECT_CONTAINS(load_error(path, {override_}), "--set " + override_ + ": " + expected);
  }
  // Every device and precision (the CUDA MoE path is compiled only: run/job.cpp warns).
  EXPECT_EQ(load_config(path, {"train.precision=bf16"}).train.precision, DType::BF16);
  EXPECT_EQ(load_config(path, {"train.device=guarded"}).train.device, Device::Guarded);
  // tp (sharded experts), pp, hdp and rings of sequences longer than a micro-batch run.
  const Config grid = load_config(path, {"parallel.tp=2", "parallel.pp=2", "parallel.hdp=2", "model.num_layers=2"});
  EXPECT_EQ(grid.parallel.tp * grid.parallel.pp * grid.parallel.hdp, 8);
  EXPECT_EQ(load_config(path, {"parallel.hdp=2", "scheduler.policy=static", "scheduler.cp=2"}).scheduler.cp, 2);
  EXPECT_EQ(load_config(path, {"parallel.hdp=2", "data.max_seq_len=4096", "data.global_batch_tokens=8192"})
                .data.max_seq_len,
            4096);
  // Expert parallelism: ep divides hdp and the experts, and needs experts.
  const Config ep = load_config(path, {"parallel.hdp=4", "parallel.ep=2"});
  EXPECT_EQ(ep.parallel.ep, 2);
  EXPECT_EQ(ep.parallel.ep_rank({0, 0, 3}), 1);
  EXPECT_EQ(ep.parallel.expert_dp_rank({0, 0, 3}), 1);
  EXPECT_CONTAINS(load_error(path, {"parallel.hdp=4", "parallel.ep=3"}),
                  "parallel.ep: 3 does not divide parallel.hdp 4");
  EXPECT_CONTAINS(load_error(path, {"parallel.hdp=8", "parallel.ep=8"}),
                  "parallel.ep: 8 does not divide model.num_experts 4");
  EXPECT_CONTAINS(load_error(path, {"parallel.hdp=2", "parallel.ep=0"}), "parallel.ep: 0 is not positive");
  EXPECT_CONTAINS(load_error(s.config(kMinimalConfig), {"parallel.hdp=2", "parallel.ep=2"}),
                  "parallel.ep: 2 needs a mixture of experts, and the model is dense; expert parallelism spreads a mixture "
                  "of experts; use model.arch: mixtral or parallel.ep: 1");
  // The routing counts are fp32 in every layout (they cross pipeline stages so).
  for (const char* pp : {"parallel.pp=1", "parallel.pp=2"}) {
    EXPECT_CONTAINS(load_error(path, {pp, "model.num_layers=2", "data.micro_batch_tokens=4194304"}),
                    "data.micro_batch_tokens: 4194304 x model.num_layers x model.experts_per_token reaches 2^24 with "
                    "model.arch 'mixtral'");
  }
  // A ring's forward pools the counts of its members: up to hdp x the longest sequence.
  EXPECT_CONTAINS(load_error(path, {"parallel.hdp=8", "model.num_layers=2", "data.max_seq_len=524288",
                                    "data.global_batch_tokens=1048576"}),
                  "parallel.hdp 8 x data.max_seq_len 524288 x model.num_layers x model.experts_per_token reaches 2^24");
}

// Each mode and policy is read once into its enum, by the names users write, and
// written back under the same names.
TEST(Config, EnumKeysReadAndWriteTheirNames) {
  Scratch s("enums");
  const std::string path = s.config(kMinimalConfig);
  const Config d = load_config(path);
  EXPECT_EQ(d.scheduler.policy, SchedulerPolicy::Naive);
  EXPECT_EQ(d.scheduler.balance, SchedulerBalance::Auto);
  EXPECT_EQ(d.loader.mode, LoaderMode::Local);
  EXPECT_EQ(d.train.resume, ResumeMode::Auto);
  EXPECT_EQ(d.train.device, Device::CPU);
  const Config c = load_config(path, {"scheduler.policy=balance", "scheduler.balance=pp", "loader.mode=remote",
                                      "train.resume=never", "train.device=guarded"});
  EXPECT_EQ(c.scheduler.policy, SchedulerPolicy::Balance);
  EXPECT_EQ(c.scheduler.balance, SchedulerBalance::Pipeline);
  EXPECT_EQ(c.loader.mode, LoaderMode::Remote);
  EXPECT_EQ(c.train.resume, ResumeMode::Never);
  EXPECT_EQ(c.train.device, Device::Guarded);
  for (const char* line : {"policy: \"balance\"", "balance: \"pp\"", "mode: \"remote\"", "resume: \"never\"",
                           "device: \"guarded\""})
    EXPECT_CONTAINS(c.yaml, line);
  const Config back = parse_config_text(c.yaml, "stored", {}, false);
  EXPECT_EQ(back.scheduler.policy, SchedulerPolicy::Balance);
  EXPECT_EQ(back.scheduler.balance, SchedulerBalance::Pipeline);
  EXPECT_EQ(back.loader.mode, LoaderMode::Remote);
  EXPECT_EQ(load_config(path, {"scheduler.policy=static"}).scheduler.policy, SchedulerPolicy::Static);
  EXPECT_EQ(load_config(path, {"scheduler.balance=dp"}).scheduler.balance, SchedulerBalance::DataParallel);
  // An unknown name in the file is reported at its line.
  const std::string bad = s.config("data:\n  path: DATA\nscheduler:\n  policy: greedy\n", "bad.yaml");
  EXPECT_EQ(load_error(bad), bad + ":4: scheduler.policy: unknown policy 'greedy'; choose naive (hybrid data "
                                   "parallelism: a sequence spans only the ranks it needs), balance (hybrid data "
                                   "parallelism with the balance scheduler) or static (a fixed dp x cp grid that "
                                   "splits every sequence, the baseline)");
}

// data.micro_batch_tokens is a rank's capacity, not a share of the batch: a
// global batch below it is valid (its micro-batches are only partly filled).
TEST(Config, GlobalBatchBelowTheMicroBatchCapacityIsValid) {
  Scratch s("global_below_micro");
  const Config c = load_config(s.config(kMinimalConfig), {"data.max_seq_len=512", "data.global_batch_tokens=1024",
                                                          "data.micro_batch_tokens=4096"});
  EXPECT_EQ(c.data.global_batch_tokens, 1024);
  EXPECT_EQ(c.data.micro_batch_tokens, 4096);
}

TEST(ConfigErrors, ADirectoryAsTheConfigFileIsNamedAsSuch) {
  Scratch s("config_is_dir");
  EXPECT_CONTAINS(load_error(s.dir), s.dir + ": is a directory, not a config file");
}

TEST(Config, CudaWithSeveralRanksIsAccepted) {
  // Device buffers go through the MPI communicator's pinned staging, so every layout
  // may run on the GPU (several ranks may share one).
  Scratch s("cuda_layouts");
  const std::string path = s.config(kMinimalConfig);
  for (const char* layout : {"parallel.tp=2", "parallel.pp=2", "parallel.hdp=2"}) {
    SCOPED_TRACE(layout);
    const Config c = load_config(path, {"train.device=cuda", layout});
    EXPECT_EQ(c.train.device, Device::CUDA);
  }
  EXPECT_EQ(load_config(path, {"train.device=cuda", "parallel.tp=2", "parallel.pp=2", "parallel.hdp=2"}).parallel.hdp,
            2);
}

TEST(Config, Bf16RunsEveryLayoutOnEveryDevice) {
  // Every op has a CUDA bf16 kernel, and rings and offload move bf16 activations
  // (parallel/ring_attention.h, model/activations.cpp): bf16 takes every layout fp32 takes,
  // on the CPU and on CUDA, sequences longer than a micro-batch and static
  // context-parallel rings included.
  Scratch s("bf16_layouts");
  const std::string path = s.config(kMinimalConfig);
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.tp=1"},
      {"parallel.tp=2"},
      {"parallel.pp=2"},
      {"parallel.hdp=2"},
      {"parallel.hdp=2", "data.max_seq_len=4096", "data.global_batch_tokens=8192"},
      {"parallel.hdp=2", "scheduler.policy=static", "scheduler.cp=2"}};
  for (const char* device : {"train.device=cpu", "train.device=cuda"}) {
    for (const std::vector<std::string>& layout : layouts) {
      std::vector<std::string> overrides = {device, "train.precision=bf16"};
      overrides.insert(overrides.end(), layout.begin(), layout.end());
      SCOPED_TRACE(std::string(device) + " " + layout.back());
      const Config c = load_config(path, overrides);
      EXPECT_EQ(c.train.precision, DType::BF16);
      EXPECT_EQ(c.train.device, std::string(device) == "train.device=cpu" ? Device::CPU : Device::CUDA);
    }
  }
  const Config ring = load_config(path, {"train.precision=bf16", "parallel.hdp=2", "scheduler.policy=static",
                                         "scheduler.cp=2"});
  EXPECT_EQ(ring.scheduler.cp, 2);
  const Config long_sequences = load_config(path, {"train.precision=bf16", "parallel.hdp=2", "data.max_seq_len=4096",
                                                   "data.global_batch_tokens=8192"});
  EXPECT_EQ(long_sequences.data.max_seq_len, 4096);
}

TEST(Config, CommunicatorChoice) {
  Scratch s("comm");
  const std::string path = s.config(kMinimalConfig);
  EXPECT_EQ(load_config(path).parallel.comm, CommMode::Auto);
  EXPECT_EQ(load_config(path, {"parallel.comm=mpi", "train.device=cuda"}).parallel.comm, CommMode::Mpi);
  EXPECT_EQ(load_config(path, {"parallel.comm=auto", "train.device=cuda"}).parallel.comm, CommMode::Auto);
  // NCCL moves GPU buffers: on the CPU it is refused, naming the key and the device.
  const std::string on_cpu = load_error(path, {"parallel.comm=nccl"});
  EXPECT_CONTAINS(on_cpu, "parallel.comm: 'nccl' needs train.device: cuda, not 'cpu' (default)");
  EXPECT_CONTAINS(on_cpu, "use parallel.comm: mpi");
  EXPECT_CONTAINS(load_error(path, {"parallel.comm=gloo"}), "parallel.comm: unknown communicator 'gloo'; choose auto");
  // On cuda it needs a build with NCCL; a config read back from a checkpoint
  // (check_files = false) is not judged by this machine's build.
  if (nccl_compiled()) {
    EXPECT_EQ(load_config(path, {"parallel.comm=nccl", "train.device=cuda"}).parallel.comm, CommMode::Nccl);
  } else {
    EXPECT_CONTAINS(load_error(path, {"parallel.comm=nccl", "train.device=cuda"}),
                    "parallel.comm: 'nccl' asked for, but this build has no NCCL");
  }
  const Config stored = load_config(path, {"train.device=cuda"});
  std::string yaml = emit_config_yaml(stored);
  const size_t at = yaml.find("comm: \"auto\"");
  ASSERT_NE(at, std::string::npos) << yaml;
  yaml.replace(at, std::string("comm: \"auto\"").size(), "comm: \"nccl\"");
  EXPECT_EQ(parse_config_text(yaml, "stored", {}, false).parallel.comm, CommMode::Nccl);
}

TEST(Config, AttentionChoice) {
  Scratch s("attention");
  const std::string path = s.config(kMinimalConfig);
  EXPECT_EQ(load_config(path).train.attention, AttentionImpl::Auto);
  EXPECT_EQ(load_config(path, {"train.attention=own"}).train.attention, AttentionImpl::Own);
  EXPECT_EQ(load_config(path, {"train.attention=cudnn", "train.device=cuda", "train.precision=bf16"}).train.attention,
            AttentionImpl::Cudnn);
  // cuDNN's fused attention runs bf16 on a GPU only: anything else is refused, naming the keys.
  const std::string on_cpu = load_error(path, {"train.attention=cudnn"});
  EXPECT_CONTAINS(on_cpu, "train.attention: 'cudnn' needs train.device: cuda and train.precision: bf16");
  EXPECT_CONTAINS(on_cpu, "use train.attention: auto or own");
  EXPECT_CONTAINS(load_error(path, {"train.attention=cudnn", "train.device=cuda", "train.precision=fp32"}),
                  "train.precision");
  EXPECT_CONTAINS(load_error(path, {"train.attention=flash"}), "train.attention: unknown implementation 'flash'");
}

// train.precision not given: bf16 on cuda, fp32 elsewhere; given, as given. The
// effective config names the choice (a checkpoint resumes with it).
TEST(Config, PrecisionDefaultsToBf16OnCudaOnly) {
  Scratch s("precision");
  const std::string path = s.config(kMinimalConfig);
  EXPECT_EQ(load_config(path).train.precision, DType::F32);
  EXPECT_EQ(load_config(path, {"train.device=guarded"}).train.precision, DType::F32);
  const Config cuda = load_config(path, {"train.device=cuda"});
  EXPECT_EQ(cuda.train.precision, DType::BF16);
  EXPECT_CONTAINS(cuda.yaml, "precision: \"bf16\"");
  EXPECT_EQ(load_config(path, {"train.device=cuda", "train.precision=fp32"}).train.precision, DType::F32);
  EXPECT_EQ(load_config(path, {"train.precision=bf16"}).train.precision, DType::BF16);
  const std::string in_yaml =
      s.config(std::string(kMinimalConfig) + "train:\n  device: cuda\n  precision: fp32\n", "fp32-on-cuda.yaml");
  EXPECT_EQ(load_config(in_yaml).train.precision, DType::F32);
  // Read back, the effective config keeps bf16 whatever device the reader names.
  EXPECT_EQ(parse_config_text(cuda.yaml, "stored", {"train.device=cpu"}, false).train.precision, DType::BF16);
}

TEST(Config, RecomputeChoice) {
  Scratch s("recompute");
  const std::string path = s.config(
      "model:\n"
      "  num_layers: 6\n"
      "data:\n"
      "  path: DATA\n");
  const Config plain = load_config(path);
  EXPECT_EQ(plain.train.recompute, RecomputeMode::None);
  EXPECT_FALSE(plain.train.recompute_layers.has_value());
  const Config full = load_config(path, {"train.recompute=full", "train.recompute_layers=4"});
  EXPECT_EQ(full.train.recompute, RecomputeMode::Full);
  EXPECT_EQ(full.train.recompute_layers, 4);
  EXPECT_EQ(load_config(path, {"train.recompute=selective"}).train.recompute, RecomputeMode::Selective);
  EXPECT_EQ(load_config(path, {"parallel.pp=2", "parallel.pp_layers=[2, 4]", "train.recompute_layers=2"})
                .train.recompute_layers,
            2);
  // Bad settings are refused naming the key: a negative count, more layers than the
  // smallest stage holds (given by pp_layers, or by the balanced split), a mode
  // that does not exist.
  EXPECT_CONTAINS(load_error(path, {"train.recompute=full", "train.recompute_layers=-1"}),
                  "train.recompute_layers: -1 is negative");
  EXPECT_CONTAINS(load_error(path, {"train.recompute_layers=7"}),
                  "train.recompute_layers: 7 is more than the 6 layers of the smallest pipeline stage");
  EXPECT_CONTAINS(load_error(path, {"parallel.pp=2", "parallel.pp_layers=[2, 4]", "train.recompute_layers=3"}),
                  "train.recompute_layers: 3 is more than the 2 layers of the smallest pipeline stage");
  EXPECT_CONTAINS(load_error(path, {"parallel.pp=3", "train.recompute_layers=3"}),
                  "train.recompute_layers: 3 is more than the 2 layers of the smallest pipeline stage");
  EXPECT_CONTAINS(load_error(path, {"train.recompute=partial"}), "train.recompute: unknown mode 'partial'");
}

// train.recompute_per_micro_batch: off by default (train.recompute_layers in every
// micro-batch, as before); on, it needs a mode, one model chunk per stage, an offload
// ratio the planners choose and stages of equal layers.
TEST(Config, RecomputePerMicroBatchChoice) {
  Scratch s("recompute_per_micro_batch");
  const std::string path = s.config(
      "model:\n"
      "  num_layers: 6\n"
      "data:\n"
      "  path: DATA\n");
  EXPECT_FALSE(load_config(path).train.recompute_per_micro_batch);
  const std::string on = "train.recompute_per_micro_batch=true";
  EXPECT_TRUE(load_config(path, {"train.recompute=full", on}).train.recompute_per_micro_batch);
  EXPECT_TRUE(load_config(path, {"train.recompute=selective", "parallel.pp=2", "train.recompute_layers=2", on})
                  .train.recompute_per_micro_batch);
  EXPECT_CONTAINS(load_error(path, {on}), "train.recompute_per_micro_batch: true with train.recompute 'none'");
  EXPECT_CONTAINS(load_error(path, {"train.recompute=full", "parallel.pp=3", "parallel.vpp=2",
                                    "offload.enabled=false", on}),
                  "train.recompute_per_micro_batch: true with parallel.vpp 2");
  EXPECT_CONTAINS(load_error(path, {"train.recompute=full", "offload.ratio=0.5", on}),
                  "train.recompute_per_micro_batch: true with offload.ratio 0.5");
  EXPECT_CONTAINS(load_error(path, {"train.recompute=full", "parallel.pp=2", "parallel.pp_layers=[2, 4]", on}),
                  "train.recompute_per_micro_batch: true with pipeline stages of unequal layers");
}

TEST(Config, SequenceParallelChoice) {
  Scratch s("sequence_parallel");
  const std::string path = s.config(
      "model:\n"
      "  num_kv_heads: 2\n"
      "data:\n"
      "  path: DATA\n");
  EXPECT_FALSE(load_config(path).parallel.sequence_parallel);
  EXPECT_TRUE(load_config(path, {"parallel.tp=2", "parallel.sequence_parallel=true"}).parallel.sequence_parallel);
  // Bad settings are refused naming the key: no tp group, Mixtral, offload of
  // sequences longer than a micro-batch (without offload they are fine: rings).
  const std::string alone = load_error(path, {"parallel.sequence_parallel=true"});
  EXPECT_CONTAINS(alone, "parallel.sequence_parallel: true with parallel.tp 1");
  EXPECT_CONTAINS(alone, "raise parallel.tp above 1");
  EXPECT_CONTAINS(load_error(path, {"parallel.tp=2", "parallel.sequence_parallel=true", "model.arch=mixtral",
                                    "model.num_experts=4", "model.experts_per_token=2"}),
                  "parallel.sequence_parallel: true with model.arch 'mixtral'");
  const std::vector<std::string> long_sequences = {"parallel.tp=2", "parallel.hdp=2", "parallel.sequence_parallel=true",
                                                   "data.max_seq_len=8192", "data.global_batch_tokens=8192"};
  EXPECT_CONTAINS(load_error(path, long_sequences), "parallel.sequence_parallel: true with offload.enabled true");
  std::vector<std::string> without_offload = long_sequences;
  without_offload.push_back("offload.enabled=false");
  EXPECT_TRUE(load_config(path, without_offload).parallel.sequence_parallel);
}

TEST(ConfigErrors, MissingDataFile) {
  Scratch s("missing_data");
  const std::string missing = s.dir + "/nope/corpus.h5";
  const std::string path = s.config(
      "model:\n"
      "  hidden_size: 128\n"
      "data:\n"
      "  max_seq_len: 512\n"
      "  path: " + missing + "\n");
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":5: data.path: file '" + missing + "' does not exist");
  EXPECT_CONTAINS(msg, "trainer make-corpus --output " + missing);
  EXPECT_CONTAINS(msg, "trainer prepare-data");
  // A relative path is relative to the working directory, and the message says so.
  const std::string relative = s.config("data:\n  path: data-cache/does-not-exist.h5\n", "relative.yaml");
  EXPECT_CONTAINS(load_error(relative), "does not exist (relative to the working directory " +
                                              std::filesystem::current_path().string() + ")");
  // A directory is not a dataset.
  const std::string dir = s.config("data:\n  path: " + s.dir + "\n", "dir.yaml");
  EXPECT_CONTAINS(load_error(dir), dir + ":2: data.path: '" + s.dir + "' is a directory, not a file");
}

TEST(ConfigErrors, MissingDataPathKey) {
  Scratch s("no_data_path");
  std::string path = s.config(
      "model:\n"
      "  hidden_size: 128\n"
      "data:\n"
      "  max_seq_len: 512\n");
  std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":3: data.path: required key is missing; set it to an HDF5 token dataset");
  EXPECT_CONTAINS(msg, "trainer make-corpus --output <path>");
  // Without a data section the location is the top of the file.
  path = s.config("model:\n  hidden_size: 128\n", "nodata.yaml");
  EXPECT_CONTAINS(load_error(path), path + ":1: data.path: required key is missing");
  // The data path is required even when files are not checked.
  EXPECT_CONTAINS(error_of([] { parse_config_text("model: {}\n", "stored", {}, false); }),
              "stored:1: data.path: required key is missing");
}

TEST(ConfigErrors, MissingInitFrom) {
  Scratch s("missing_init_from");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "train:\n"
      "  init_from: " + s.dir + "/missing.ckpt\n");
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":4: train.init_from: directory '" + s.dir + "/missing.ckpt' does not exist");
  EXPECT_CONTAINS(msg, "checkpoint directory");
  // A checkpoint is a directory; a plain file is refused.
  EXPECT_CONTAINS(load_error(path, {"train.init_from=" + path}), "is not a directory");
}

TEST(Config, CheckFilesFalseSkipsExistence) {
  const Config c = parse_config_text(
      "data:\n  path: /definitely/not/here.h5\ntrain:\n  init_from: /not/here.ckpt\n", "ckpt:config", {}, false);
  EXPECT_EQ(c.data.path, "/definitely/not/here.h5");
  EXPECT_EQ(c.source, "ckpt:config");
  EXPECT_CONTAINS(error_of([] { parse_config_text("data:\n  path: /definitely/not/here.h5\n", "ckpt:config"); }),
              "ckpt:config:2: data.path: file '/definitely/not/here.h5' does not exist");
}

TEST(ConfigErrors, DatasetVocabularyTooLarge) {
  Scratch s("vocab");
  const std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "model:\n"
      "  vocab_size: 258\n");
  const Config c = load_config(path);
  EXPECT_NO_THROW(validate_dataset_vocab(c, 258, 257));
  EXPECT_NO_THROW(validate_dataset_vocab(c, 100, 99));  // a smaller tokenizer fits the embedding
  // A larger tokenizer vocabulary is refused even when the ids present happen to fit:
  // the data was made for another model.
  const std::string msg = error_of([&] { validate_dataset_vocab(c, 32000, 100); });
  EXPECT_CONTAINS(msg, path + ":4: model.vocab_size: 258 is too small for data.path '" + s.data +
                             "', whose tokenizer's vocabulary has 32000 entries (largest token id in it 100)");
  EXPECT_CONTAINS(msg, "set model.vocab_size to at least 32000");
  EXPECT_CONTAINS(error_of([&] { validate_dataset_vocab(c, 258, 258); }), "largest token id in it 258");
  // With vocab_size at its default, the error points at the config file.
  const Config d = load_config(s.config(kMinimalConfig, "min.yaml"));
  EXPECT_CONTAINS(error_of([&] { validate_dataset_vocab(d, 300, 299); }),
              s.dir + "/min.yaml:1: model.vocab_size: 258 is too small");
}

TEST(ConfigErrors, BadOverrideSyntax) {
  Scratch s("bad_override");
  const std::string path = s.config(kMinimalConfig);
  EXPECT_EQ(load_error(path, {"model.hidden_size"}),
            "--set model.hidden_size: malformed override, there is no '='; write --set section.key=value, "
            "e.g. --set optim.lr=1e-3");
  EXPECT_CONTAINS(load_error(path, {"=3"}), "--set =3: malformed override, the key path before '=' is empty");
  EXPECT_CONTAINS(load_error(path, {"model=3"}),
              "--set model=3: model: an override must name a key inside the section; write --set "
                        "model.<key>=value with one of: arch, vocab_size");
  EXPECT_CONTAINS(load_error(path, {"optim.lr=[1, "}), "--set optim.lr=[1, : optim.lr: cannot read the value as YAML");
  EXPECT_CONTAINS(load_error(path, {"optim.lr=fast"}),
              "--set optim.lr=fast: optim.lr: expected a number, got 'fast'");
}

TEST(ConfigErrors, UnknownOverrideKey) {
  Scratch s("unknown_override");
  const std::string path = s.config(kMinimalConfig);
  std::string msg = load_error(path, {"optim.lr=1e-3", "model.hiden_size=64"});
  EXPECT_CONTAINS(msg, "--set model.hiden_size=64: model.hiden_size: unknown key in section 'model'; "
                             "did you mean 'hidden_size'? valid keys in model: arch, vocab_size");
  msg = load_error(path, {"optimizer.lr=1e-3"});
  EXPECT_CONTAINS(msg, "--set optimizer.lr=1e-3: optimizer: unknown section");
  EXPECT_CONTAINS(msg, "valid sections: model, data, optim, train, parallel");
  msg = load_error(path, {"lr=1e-3"});
  EXPECT_CONTAINS(msg, "--set lr=1e-3: lr: unknown section; keys go inside their section: did you mean "
                             "'optim.lr'?");
  msg = load_error(path, {"model.hidden_size.x=1"});
  EXPECT_CONTAINS(msg, "model.hidden_size.x: unknown key in section 'model'");
}

// train.checkpoint_when_busy (defer | wait) was folded into train.checkpoint_budget:
// a config naming it is refused with the way to say it now, in a file or an override.
TEST(ConfigErrors, ARetiredKeyIsRefusedNamingWhatReplacedIt) {
  Scratch s("retired_key");
  const std::string path = s.config(std::string(kMinimalConfig) + "train:\n  checkpoint_when_busy: wait\n");
  EXPECT_CONTAINS(load_error(path, {}), "train.checkpoint_when_busy: this key is no longer read; it was replaced by "
                                        "train.checkpoint_budget: `wait` is `checkpoint_budget: 0`");
  const std::string plain = s.config(kMinimalConfig);
  EXPECT_CONTAINS(load_error(plain, {"train.checkpoint_when_busy=defer"}),
                  "--set train.checkpoint_when_busy=defer: train.checkpoint_when_busy: this key is no longer read");
}

// A checkpoint written before the key was retired stores it in its manifest (the
// effective config holds every key): eval, generate, export-hf and init_from read that
// config through parse_manifest_config, which skips it, so older checkpoints stay readable.
TEST(ConfigErrors, AManifestsRetiredKeyIsSkipped) {
  Scratch s("retired_manifest");
  const Config c = load_config(s.config(kMinimalConfig), {"train.checkpoint_every=7"}, false);
  std::string old_manifest_config = c.yaml;
  const size_t key = old_manifest_config.find("  checkpoint_every: 7\n");
  ASSERT_NE(key, std::string::npos);
  old_manifest_config.insert(key, "  checkpoint_when_busy: defer\n");
  const Config back = parse_manifest_config(old_manifest_config, "runs/old/step_00000007");
  EXPECT_EQ(back.train.checkpoint_every, 7);
  EXPECT_EQ(back.yaml, c.yaml);
  EXPECT_EQ(back.source, "runs/old/step_00000007/manifest.yaml (config)");
  // A user's text still refuses it.
  EXPECT_CONTAINS(error_of([&] { parse_config_text(old_manifest_config, "stored", {}, false); }),
                  "train.checkpoint_when_busy: this key is no longer read");
}

TEST(Config, ParallelDegreesAndStageLayers) {
  Scratch s("parallel-ok");
  const std::string path = s.config(
      "model:\n"
      "  num_layers: 6\n"
      "  num_kv_heads: 2\n"
      "data:\n"
      "  path: DATA\n"
      "parallel:\n"
      "  tp: 2\n"
      "  pp: 2\n"
      "  hdp: 3\n"
      "  pp_layers: [2, 4]\n");
  const Config c = load_config(path);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.parallel.hdp, 3);
  EXPECT_EQ(c.parallel.pp_layers, (std::vector<int64_t>{2, 4}));
  const Config again = parse_config_text(c.yaml, "again", {}, false);
  EXPECT_EQ(again.parallel.pp_layers, c.parallel.pp_layers);
  EXPECT_EQ(load_config(path, {"parallel.pp_layers=[3, 3]"}).parallel.pp_layers, (std::vector<int64_t>{3, 3}));
  EXPECT_TRUE(load_config(path, {"parallel.pp_layers=[]"}).parallel.pp_layers.empty());
}

TEST(Config, HdpAutoTakesWhatTpAndPpLeaveOfTheJob) {
  Scratch s("hdp-auto");
  const std::string path = s.config(
      "model:\n"
      "  num_kv_heads: 2\n"
      "data:\n"
      "  path: DATA\n"
      "parallel:\n"
      "  tp: 2\n"
      "  hdp: auto\n");  // line 7
  // A job of 8 ranks: 8 / (tp 2 x pp 1).
  const Config job = load_config(path, {}, true, 8);
  EXPECT_EQ(job.parallel.hdp, 4);
  EXPECT_FALSE(job.parallel.hdp_auto);
  EXPECT_CONTAINS(job.yaml, "  hdp: 4\n");
  EXPECT_EQ(load_config(path, {"parallel.pp=2", "model.num_layers=4"}, true, 8).parallel.hdp, 2);
  // No job (trainer config): auto stays auto, checked as hdp 1.
  const Config none = load_config(path);
  EXPECT_TRUE(none.parallel.hdp_auto);
  EXPECT_EQ(none.parallel.hdp, 1);
  EXPECT_CONTAINS(none.yaml, "  hdp: auto\n");
  EXPECT_TRUE(parse_config_text(none.yaml, "again", {}, false).parallel.hdp_auto);
  // ...as the least hdp its ep allows, so that the ep rule holds.
  EXPECT_EQ(load_config(path, {"model.arch=mixtral", "parallel.ep=2"}).parallel.hdp, 2);
  // A number or --set parallel.hdp=auto; anything else is refused naming both.
  EXPECT_EQ(load_config(path, {"parallel.hdp=3"}, true, 8).parallel.hdp, 3);
  EXPECT_TRUE(load_config(s.config(kMinimalConfig, "minimal.yaml"), {"parallel.hdp=auto"}).parallel.hdp_auto);
  EXPECT_CONTAINS(load_error(path, {"parallel.hdp=many"}),
                  "--set parallel.hdp=many: parallel.hdp: expected an integer, got 'many'; write a whole number such "
                  "as 1, or auto");
  // A job that tp x pp does not divide.
  EXPECT_CONTAINS(error_of([&] { load_config(path, {}, true, 7); }),
                  path + ":7: parallel.hdp: auto needs the job's 7 training rank(s) to be a multiple of parallel.tp x "
                         "parallel.pp = 2 x 1 = 2; launch a multiple of 2 training ranks, or set parallel.hdp");
  // Loader ranks do not train.
  const Config remote = load_config(path, {"loader.mode=remote", "loader.servers=2"}, true, 6);
  EXPECT_EQ(remote.parallel.hdp, 2);
  EXPECT_CONTAINS(error_of([&] { load_config(path, {"loader.mode=remote"}, true, 4); }),
                  "auto needs the job's 3 training rank(s) (4 minus loader.servers 1) to be a multiple of");
}

TEST(Config, CheckpointsGoUnderTheRunDirectoryUnlessPutElsewhere) {
  Scratch s("checkpoint-dir");
  const std::string path = s.config(kMinimalConfig);
  const Config defaults = load_config(path);
  EXPECT_EQ(defaults.train.checkpoint_dir, "");
  EXPECT_EQ(resolved_checkpoint_dir(defaults.train), "runs/default/checkpoints");
  const Config run = load_config(path, {"train.run_dir=runs/a"});
  EXPECT_EQ(resolved_checkpoint_dir(run.train), "runs/a/checkpoints");
  // The effective config keeps the key empty, so that the same config used for
  // another run directory (import-hf's train-config.yaml, a checkpoint's config)
  // puts the checkpoints under that one, not under runs/a.
  EXPECT_CONTAINS(run.yaml, "  checkpoint_dir: \"\"\n");
  const Config carried = parse_config_text(run.yaml, "carried.yaml", {"train.run_dir=runs/b"}, false);
  EXPECT_EQ(resolved_checkpoint_dir(carried.train), "runs/b/checkpoints");
  const Config elsewhere = load_config(path, {"train.run_dir=runs/a", "train.checkpoint_dir=/scratch/ckpt"});
  EXPECT_EQ(resolved_checkpoint_dir(elsewhere.train), "/scratch/ckpt");
  EXPECT_CONTAINS(elsewhere.yaml, "  checkpoint_dir: \"/scratch/ckpt\"\n");
  EXPECT_EQ(resolved_checkpoint_dir(load_config(path, {"train.run_dir=runs/a", "train.checkpoint_dir=''"}).train),
            "runs/a/checkpoints");
}

TEST(ConfigErrors, StaticGridMustHoldTheLongestSequence) {
  Scratch s("static-grid");
  const std::string min = s.config(kMinimalConfig, "min.yaml");
  // Sequences longer than a micro-batch are fine for HDP (they span ranks) ...
  EXPECT_NO_THROW(load_config(min, {"data.micro_batch_tokens=256", "parallel.hdp=4"}));
  // ... but the static grid splits a sequence over at most hdp ranks.
  EXPECT_CONTAINS(load_error(min, {"data.micro_batch_tokens=256", "parallel.hdp=2", "scheduler.policy=static"}),
                  "data.max_seq_len: 1024 (default) does not fit the static grid: at most parallel.hdp x "
                  "data.micro_batch_tokens = 512 tokens");
  EXPECT_CONTAINS(load_error(min, {"parallel.hdp=4", "scheduler.cp=3"}), "scheduler.cp: 3 does not divide parallel.hdp 4");
}

TEST(ConfigErrors, ParallelDegreesMustFitTheModel) {
  Scratch s("parallel");
  const std::string path = s.config(
      "model:\n"
      "  num_layers: 4\n"
      "  num_heads: 4\n"
      "  num_kv_heads: 2\n"
      "data:\n"
      "  path: DATA\n"
      "parallel:\n"
      "  tp: 4\n");
  EXPECT_CONTAINS(load_error(path), path + ":8: parallel.tp: 4 does not divide model.num_kv_heads 2");
  const std::string min = s.config(kMinimalConfig, "min.yaml");
  EXPECT_CONTAINS(load_error(min, {"parallel.pp=9"}), "parallel.pp: 9 is more than model.num_layers");
  EXPECT_CONTAINS(load_error(path, {"parallel.tp=1", "parallel.pp=2", "parallel.pp_layers=[1, 2]"}),
                  "parallel.pp_layers: [1, 2] does not give each of the 2 stages at least one layer of the model's 4");
  EXPECT_CONTAINS(load_error(path, {"parallel.tp=1", "parallel.pp=2", "parallel.pp_layers=[4, 0]"}),
                  "parallel.pp_layers");
  EXPECT_CONTAINS(load_error(path, {"parallel.tp=1", "parallel.pp_layers=[a]"}), "expected a list of integers");
  EXPECT_CONTAINS(load_error(min, {"parallel.hdp=0"}), "parallel.hdp: 0 is not positive");
  // Interleaved 1F1B: pp x vpp virtual stages of at least one layer, for dense
  // models without offload and without pp_layers (one count per stage).
  EXPECT_CONTAINS(load_error(min, {"parallel.vpp=0"}), "parallel.vpp: 0 is not positive");
  EXPECT_CONTAINS(load_error(path, {"parallel.tp=1", "parallel.vpp=2"}),
                  "parallel.vpp: 2 model chunks per stage need parallel.pp > 1 and pp x vpp <= model.num_layers 4");
  EXPECT_CONTAINS(load_error(path, {"parallel.tp=1", "parallel.pp=2", "parallel.vpp=3"}),
                  "pp x vpp <= model.num_layers 4");
  const std::vector<std::string> interleaved = {"parallel.tp=1", "parallel.pp=2", "parallel.vpp=2"};
  EXPECT_EQ(load_config(path, interleaved).parallel.vpp, 2);
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), interleaved.begin(), interleaved.end());
    return load_error(path, more);
  };
  EXPECT_CONTAINS(with({"model.arch=mixtral", "model.num_experts=4", "model.experts_per_token=2"}),
                  "parallel.vpp: 2 with model.arch 'mixtral': the trainer interleaves dense models only");
  EXPECT_CONTAINS(with({"data.max_seq_len=8192", "data.global_batch_tokens=8192"}),
                  "parallel.vpp: 2 with offload.enabled true (default) and sequences longer than a micro-batch");
  EXPECT_EQ(load_config(path, {"parallel.tp=1", "parallel.pp=2", "parallel.vpp=2", "data.max_seq_len=8192",
                               "data.global_batch_tokens=8192", "offload.enabled=false"})
                .parallel.vpp,
            2);
  EXPECT_CONTAINS(with({"parallel.pp_layers=[1, 3]"}),
                  "parallel.vpp: 2 with parallel.pp_layers [1, 3]: pp_layers gives one count per stage");
}

TEST(ConfigErrors, DuplicateKeysAndSyntaxErrors) {
  Scratch s("syntax");
  std::string path = s.config(
      "data:\n"
      "  path: DATA\n"
      "  path: other.h5\n");
  EXPECT_CONTAINS(load_error(path), path + ":3: data.path: key given twice (first at " + path + ":2)");
  path = s.config(
      "data:\n"
      "  path: DATA\n"
      "model: [unclosed\n", "broken.yaml");
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path + ":");
  EXPECT_CONTAINS(msg, "YAML syntax error");
  path = s.config("- a\n- b\n", "list.yaml");
  EXPECT_CONTAINS(load_error(path), path + ":1: (top level): expected a mapping of sections");
  EXPECT_CONTAINS(load_error(s.dir + "/absent.yaml"),
              s.dir + "/absent.yaml: cannot open the config file (No such file or directory)");
}

TEST(Config, EffectiveYamlRoundTrips) {
  Scratch s("round_trip");
  const std::string path = s.config(kFullConfig);
  const Config c = load_config(path, {"train.run_dir=\"runs/odd: name\" # a comment",
                                      "train.checkpoint_dir='null'",  // the string "null", which must stay quoted
                                      "data.seed=18446744073709551615", "optim.lr=0.1",
                                      "optim.min_lr=0.030000000000000002", "model.rope_theta=123456.789"});
  EXPECT_EQ(c.train.run_dir, "runs/odd: name");  // YAML quoting and comments work in --set
  EXPECT_EQ(c.train.checkpoint_dir, "null");
  // Every key is written, in schema order.
  for (const char* key : {"arch:", "vocab_size:", "init_std:", "path:", "seed:", "grad_clip:", "threads:", "hdp:"})
    EXPECT_CONTAINS(c.yaml, key);
  EXPECT_LT(c.yaml.find("model:"), c.yaml.find("data:"));
  EXPECT_LT(c.yaml.find("train:"), c.yaml.find("parallel:"));
  const Config back = parse_config_text(c.yaml, "stored", {}, /*check_files=*/false);
  expect_same(back, c);
  EXPECT_EQ(back.yaml, c.yaml);
  EXPECT_EQ(back.source, "stored");

  // Defaults round-trip as well, including the empty init_from.
  const Config d = load_config(s.config(kMinimalConfig, "min.yaml"));
  const Config d_back = parse_config_text(d.yaml, "stored", {}, false);
  expect_same(d_back, d);
  EXPECT_EQ(d_back.yaml, d.yaml);
  EXPECT_EQ(emit_config_yaml(d), d.yaml);
}

// The shipped configs parse and hold the documented shapes.
TEST(Config, ShippedConfigs) {
  auto read = [](const std::string& name) {
    std::ifstream in(std::string(HDP_SOURCE_DIR) + "/configs/" + name);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_FALSE(text.str().empty()) << name;
    return text.str();
  };
  const Config tiny = parse_config_text(read("tiny-llama.yaml"), "configs/tiny-llama.yaml", {}, false);
  EXPECT_EQ(tiny.model.vocab_size, 258);
  EXPECT_EQ(tiny.model.hidden_size, 128);
  EXPECT_EQ(tiny.model.num_layers, 4);
  EXPECT_EQ(tiny.model.num_heads, 4);
  EXPECT_EQ(tiny.model.num_kv_heads, 2);
  EXPECT_EQ(tiny.data.max_seq_len, 512);
  EXPECT_EQ(tiny.data.micro_batch_tokens, 2048);
  EXPECT_EQ(tiny.data.global_batch_tokens, 4096);
  EXPECT_EQ(tiny.data.path, "data-cache/demo-corpus.h5");
  EXPECT_EQ(tiny.train.run_dir, "runs/tiny-llama");
  EXPECT_EQ(resolved_checkpoint_dir(tiny.train), "runs/tiny-llama/checkpoints");
  EXPECT_EQ(tiny.train.checkpoint_every, 100);
  EXPECT_EQ(tiny.train.log_every, 10);
  EXPECT_EQ(tiny.optim.warmup_steps, 20);
  EXPECT_EQ(tiny.optim.min_lr, 2e-4);

  // tiny-mistral: tiny-llama's shape and data with a window shorter than the sequences.
  const Config mistral = parse_config_text(read("tiny-mistral.yaml"), "configs/tiny-mistral.yaml", {}, false);
  EXPECT_EQ(mistral.model.arch, "mistral");
  EXPECT_EQ(mistral.model.sliding_window, std::optional<int64_t>(128));
  EXPECT_LT(*mistral.model.sliding_window, mistral.data.max_seq_len);
  EXPECT_EQ(mistral.model.hidden_size, tiny.model.hidden_size);
  EXPECT_EQ(mistral.model.num_layers, tiny.model.num_layers);
  EXPECT_EQ(mistral.data.path, tiny.data.path);
  EXPECT_EQ(mistral.train.run_dir, "runs/tiny-mistral");

  const Config bench = parse_config_text(read("bench-llama.yaml"), "configs/bench-llama.yaml", {}, false);
  EXPECT_EQ(bench.model.vocab_size, 32000);
  EXPECT_EQ(bench.model.hidden_size, 512);
  EXPECT_EQ(bench.model.num_layers, 8);
  EXPECT_EQ(bench.model.num_heads, 8);
  EXPECT_EQ(bench.model.num_kv_heads, 4);
  EXPECT_EQ(bench.model.ffn_hidden_size, 1376);
  EXPECT_EQ(bench.data.max_seq_len, 1024);
  EXPECT_EQ(bench.data.global_batch_tokens, 4096);
  EXPECT_EQ(bench.data.micro_batch_tokens, 4096);
  EXPECT_EQ(bench.data.path, "data-cache/bench-corpus.h5");
  EXPECT_EQ(bench.train.steps, 10);
  EXPECT_EQ(bench.train.checkpoint_every, 0);
}

}  // namespace
}  // namespace hdp
