// trainer import-hf and export-hf (checkpoint/hf_checkpoint.h), through the binary:
// export then import gives bit-identical weights (fp32, one file and shards; Mixtral
// to the same eval loss), bf16 and f16 files import as their exact float32 values,
// the written config.json carries what transformers' LlamaConfig and MixtralConfig
// need (LLaMA 3's RoPE scaling both ways), and config.json settings we do not
// implement or broken safetensors files end with exit code 2 and a message naming
// the file and the key or tensor. Also train.init_from's refusal of another model.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "kernels/dtype.h"
#include "data/dataset.h"
#include "reference_llama.h"
#include "test_util.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "trainer_runs.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::file_text;
using testing::read_weights;
using testing::run_trainer;
using testing::scratch_dir;
using testing::small_corpus;
using testing::small_model_overrides;

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

const std::string kConfig = std::string(HDP_SOURCE_DIR) + "/configs/tiny-llama.yaml";

// One JSON Lines record {"text": ...} of a demo document's text, newlines as spaces.
std::string jsonl_record(const std::string& document) {
  std::string text;
  for (char c : document) {
    if (c == '"' || c == '\\') text += '\\';
    text += c == '\n' ? ' ' : c;
  }
  return "{\"text\": \"" + text + "\"}\n";
}

// A trained checkpoint of the small model (2 steps, so the weights are not the init's).
std::string trained_checkpoint(const std::string& dir, const std::string& extra = "") {
  auto r = run_trainer("train " + kConfig + " --set data.path=" + small_corpus() + " --set train.run_dir=" + dir +
                       " --set train.checkpoint_dir=" + dir + "/ckpt --set train.steps=2 --set train.checkpoint_every=2" +
                       small_model_overrides() + " " + extra);
  if (r.exit_code != 0) throw std::runtime_error("training failed: " + r.output);
  return dir + "/ckpt/step-00000002";
}

std::map<std::string, std::vector<float>> weights_of(const std::string& checkpoint, const std::string& out) {
  auto r = run_trainer("export " + checkpoint + " --output " + out);
  if (r.exit_code != 0) throw std::runtime_error("export failed: " + r.output);
  return read_weights(out);
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

void write_json(const std::string& path, const Json& j) { std::ofstream(path) << j.dump(2); }

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(HfCheckpoint, ExportThenImportIsBitIdenticalInFp32) {
  const std::string dir = scratch_dir("hf-roundtrip");
  const std::string ckpt = trained_checkpoint(dir + "/run");
  const auto original = weights_of(ckpt, dir + "/original.h5");

  // Small shards: the 0.3 M-parameter model in several files with the index.
  auto r = run_trainer("export-hf " + ckpt + " --output " + dir + "/hf --dtype fp32 --max-shard-size 256K");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The demo corpus is byte-level: no Hugging Face tokenizer file exists for it, and export-hf says so.
  EXPECT_CONTAINS(r.output, "the byte-level tokenizer has no Hugging Face tokenizer file (ids 0-255 are the UTF-8 bytes");
  EXPECT_FALSE(fs::exists(dir + "/hf/tokenizer.json") || fs::exists(dir + "/hf/tokenizer.model"));
  const Json index = read_json(dir + "/hf/model.safetensors.index.json");
  std::set<std::string> shard_files;
  for (const auto& [name, file] : index["weight_map"].items()) shard_files.insert(file.get<std::string>());
  EXPECT_GT(shard_files.size(), 1u);
  EXPECT_EQ(index["weight_map"].size(), original.size());
  uint64_t total = 0;
  for (const std::string& f : shard_files) {
    EXPECT_TRUE(fs::exists(dir + "/hf/" + f)) << f;
    SafetensorsReader shard(dir + "/hf/" + f);
    EXPECT_EQ(shard.metadata().at("format"), "pt");  // transformers refuses files without it
    for (const SafetensorsTensor& t : shard.tensors()) {
      EXPECT_EQ(t.dtype, SafetensorsDtype::F32);
      EXPECT_EQ(index["weight_map"][t.name], f);
      total += t.end - t.begin;
    }
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_FALSE(fs::exists(dir + "/hf/model.safetensors"));

  const Json config = read_json(dir + "/hf/config.json");
  EXPECT_EQ(config["architectures"], Json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["intermediate_size"], 128);
  EXPECT_EQ(config["num_hidden_layers"], 4);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["head_dim"], 16);
  EXPECT_EQ(config["vocab_size"], 258);
  EXPECT_EQ(config["max_position_embeddings"], 128);
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);
  EXPECT_EQ(config["rope_theta"], 10000.0);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["bos_token_id"], 256);
  EXPECT_EQ(config["eos_token_id"], 257);
  EXPECT_TRUE(config["rope_scaling"].is_null());
  const Json generation = read_json(dir + "/hf/generation_config.json");
  EXPECT_EQ(generation["bos_token_id"], 256);
  EXPECT_EQ(generation["eos_token_id"], 257);

  r = run_trainer("import-hf " + dir + "/hf --output " + dir + "/imported");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "train.init_from=" + dir + "/imported/step-00000000");
  // The training config written beside it reads back with the model config.json describes.
  const std::string train_config = file_text(dir + "/imported/train-config.yaml");
  EXPECT_CONTAINS(train_config, "hidden_size: 64");
  EXPECT_CONTAINS(train_config, "num_kv_heads: 2");
  EXPECT_CONTAINS(train_config, "ffn_hidden_size: 128");
  EXPECT_CONTAINS(train_config, "max_seq_len: 128");
  // Its checkpoint directory is left empty, so that it follows the run directory
  // training is given (not the one import-hf had).
  EXPECT_CONTAINS(train_config, "  checkpoint_dir: \"\"\n");
  r = run_trainer("train " + dir + "/imported/train-config.yaml --set data.path=" + small_corpus() +
                  " --set train.init_from=" + dir + "/imported/step-00000000 --set train.steps=1 --set train.run_dir=" +
                  dir + "/trained --set train.checkpoint_every=1 --set train.threads=1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/trained/checkpoints/step-00000001/manifest.yaml")) << r.output;
  EXPECT_CONTAINS(r.output, "initial weights from " + dir + "/imported/step-00000000");
  const auto imported = weights_of(dir + "/imported/step-00000000", dir + "/imported.h5");
  ASSERT_EQ(imported.size(), original.size());
  for (const auto& [name, w] : original) {
    ASSERT_TRUE(imported.count(name)) << name;
    EXPECT_TRUE(bit_equal(imported.at(name), w)) << name;
  }

  // And back out again: one file this time, the same bytes as the shards held.
  r = run_trainer("export-hf " + dir + "/imported --output " + dir + "/hf2 --dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  SafetensorsReader single(dir + "/hf2/model.safetensors");
  EXPECT_EQ(single.tensors().size(), original.size());
  for (const auto& [name, w] : original) EXPECT_TRUE(bit_equal(single.read_floats(*single.find(name)), w)) << name;
}

// The small model as Mixtral: 4 experts, each token to 2 (tests' --set of tiny-llama).
const std::string kMixtral = " --set model.arch=mixtral --set model.num_experts=4 --set model.experts_per_token=2"
                             " --set model.router_aux_loss_coef=0.02";

// The loss `trainer eval` prints for a checkpoint on a dataset ("loss 5.123456").
std::string eval_loss(const std::string& checkpoint, const std::string& data) {
  auto r = run_trainer("eval " + checkpoint + " --data " + data + " --max-seq-len 64 --max-documents 8 --threads 1");
  if (r.exit_code != 0) throw std::runtime_error("eval failed: " + r.output);
  std::smatch m;
  if (!std::regex_search(r.output, m, std::regex(R"(predicted tokens: loss ([0-9.]+))")))
    throw std::runtime_error("no loss in: " + r.output);
  return m[1];
}

// Mixtral: its router and every expert's w1, w2 and w3 under Hugging Face's names,
// config.json with MixtralConfig's keys, and back bit for bit to the same loss.
TEST(HfCheckpoint, MixtralExportThenImportIsBitIdenticalWithTheSameLoss) {
  const std::string dir = scratch_dir("hf-mixtral");
  const std::string ckpt = trained_checkpoint(dir + "/run", kMixtral);
  const auto original = weights_of(ckpt, dir + "/original.h5");
  // 4 layers x (4 attention + 2 norms + router + 4 experts x 3) + embedding, final norm, head.
  EXPECT_EQ(original.size(), 4u * 19 + 3);

  auto r = run_trainer("export-hf " + ckpt + " --output " + dir + "/hf --dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json config = read_json(dir + "/hf/config.json");
  EXPECT_EQ(config["architectures"], Json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["num_local_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(config["router_jitter_noise"], 0.0);
  EXPECT_EQ(config["output_router_logits"], false);
  EXPECT_EQ(config["intermediate_size"], 128);  // each expert's
  EXPECT_TRUE(config["sliding_window"].is_null());
  EXPECT_TRUE(config["rope_scaling"].is_null());
  EXPECT_EQ(config["rope_parameters"], Json({{"rope_theta", 10000.0}, {"rope_type", "default"}}));
  SafetensorsReader weights(dir + "/hf/model.safetensors");
  EXPECT_EQ(weights.tensors().size(), original.size());
  EXPECT_EQ(weights.find("model.layers.3.block_sparse_moe.gate.weight")->shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(weights.find("model.layers.3.block_sparse_moe.experts.3.w1.weight")->shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(weights.find("model.layers.3.block_sparse_moe.experts.3.w2.weight")->shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(weights.find("model.layers.3.block_sparse_moe.experts.3.w3.weight")->shape, (std::vector<int64_t>{128, 64}));

  r = run_trainer("import-hf " + dir + "/hf --output " + dir + "/imported");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string train_config = file_text(dir + "/imported/train-config.yaml");
  EXPECT_CONTAINS(train_config, "arch: \"mixtral\"");
  EXPECT_CONTAINS(train_config, "num_experts: 4");
  EXPECT_CONTAINS(train_config, "experts_per_token: 2");
  EXPECT_CONTAINS(train_config, "router_aux_loss_coef: 0.02");
  const std::string imported = dir + "/imported/step-00000000";
  const auto back = weights_of(imported, dir + "/imported.h5");
  ASSERT_EQ(back.size(), original.size());
  for (const auto& [name, w] : original) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(bit_equal(back.at(name), w)) << name;
  }
  // --set may change how the model trains, not what it is.
  r = run_trainer("import-hf " + dir + "/hf --output " + dir + "/more-experts --set model.num_experts=8");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--set model.num_experts changes the model that " + dir + "/hf/config.json describes "
                            "(model.num_experts 4 (config.json) vs 8 (--set))");
  r = run_trainer("import-hf " + dir + "/hf --output " + dir + "/other-coef --set model.router_aux_loss_coef=0.05");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(file_text(dir + "/other-coef/train-config.yaml"), "router_aux_loss_coef: 0.05");
  // The same model: the same loss (with its load-balancing term) to the printed digit.
  const std::string loss = eval_loss(ckpt, small_corpus());
  EXPECT_EQ(eval_loss(imported, small_corpus()), loss);
  EXPECT_GT(std::stod(loss), 1.0);
}

TEST(HfCheckpoint, Bf16AndF16FilesImportAsTheirExactValues) {
  const std::string dir = scratch_dir("hf-dtypes");
  const std::string ckpt = trained_checkpoint(dir + "/run", "--set model.tie_embeddings=true");
  const auto original = weights_of(ckpt, dir + "/original.h5");
  EXPECT_FALSE(original.count("lm_head.weight"));  // tied

  auto r = run_trainer("export-hf " + ckpt + " --output " + dir + "/bf16");  // bf16 is the default
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(dir + "/bf16/config.json")["torch_dtype"], "bfloat16");
  EXPECT_EQ(read_json(dir + "/bf16/config.json")["tie_word_embeddings"], true);
  SafetensorsReader bf16(dir + "/bf16/model.safetensors");
  EXPECT_EQ(bf16.find("lm_head.weight"), nullptr);
  for (const SafetensorsTensor& t : bf16.tensors()) EXPECT_EQ(t.dtype, SafetensorsDtype::BF16) << t.name;

  // The same tensors as F16, written with our writer, next to the same config.json.
  fs::create_directories(dir + "/f16");
  fs::copy_file(dir + "/bf16/config.json", dir + "/f16/config.json");
  {
    std::vector<SafetensorsWriter::Spec> specs;
    for (const SafetensorsTensor& t : bf16.tensors()) specs.push_back({t.name, SafetensorsDtype::F16, t.shape});
    SafetensorsWriter writer(dir + "/f16/model.safetensors", specs, {{"format", "pt"}});
    for (const SafetensorsTensor& t : bf16.tensors()) writer.write_floats(original.at(t.name));
    writer.finish();
  }

  for (const char* kind : {"bf16", "f16"}) {
    const std::string out = dir + "/imported-" + kind;
    r = run_trainer("import-hf " + dir + "/" + kind + " --output " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto imported = weights_of(out + "/step-00000000", out + ".h5");
    ASSERT_EQ(imported.size(), original.size()) << kind;
    for (const auto& [name, w] : original) {
      std::vector<float> want(w.size());
      for (size_t i = 0; i < w.size(); ++i)
        want[i] = kind == std::string("bf16") ? round_bf16(w[i]) : f16_to_float(float_to_f16(w[i]));
      EXPECT_TRUE(bit_equal(imported.at(name), want)) << kind << " " << name;
    }
  }
}

class HfImportRefuses : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Per process: ctest runs each test of the suite as its own process, maybe at once.
    dir_ = scratch_dir("hf-refusals-" + std::to_string(getpid()));
    const std::string ckpt = trained_checkpoint(dir_ + "/run");
    auto r = run_trainer("export-hf " + ckpt + " --output " + dir_ + "/good --dtype fp32");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  // A copy of the good model directory with config.json edited by `edit`.
  std::string variant(const std::string& name, const std::function<void(Json&)>& edit) {
    const std::string out = dir_ + "/" + name;
    fs::remove_all(out);
    fs::copy(dir_ + "/good", out);
    Json config = read_json(out + "/config.json");
    edit(config);
    write_json(out + "/config.json", config);
    return out;
  }
  testing::CommandResult import(const std::string& hf) {
    fs::remove_all(hf + "-ckpt");
    return run_trainer("import-hf " + hf + " --output " + hf + "-ckpt");
  }
  static std::string dir_;
};
std::string HfImportRefuses::dir_;

TEST_F(HfImportRefuses, SettingsWeDoNotImplement) {
  struct Case {
    const char* name;
    std::function<void(Json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      // RoPE types other than default and llama3, in either dict, named with the value.
      {"rope-linear", [](Json& c) { c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; },
       "config.json: rope_scaling.rope_type: 'linear' is not supported; this build implements rope_type 'default' "
       "and 'llama3'"},
      {"rope-dynamic", [](Json& c) { c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}}; },
       "config.json: rope_scaling.type: 'dynamic' is not supported"},
      {"rope-yarn", [](Json& c) { c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e4}}; },
       "config.json: rope_parameters.rope_type: 'yarn' is not supported"},
      {"rope-longrope", [](Json& c) { c["rope_parameters"] = {{"rope_type", "longrope"}}; },
       "config.json: rope_parameters.rope_type: 'longrope' is not supported"},
      {"rope-extra-key", [](Json& c) {
         c["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0}, {"attention_factor", 0.5}};
       },
       "config.json: rope_parameters.attention_factor: 0.5 is not supported"},
      {"rope-llama3-no-factor", [](Json& c) {
         c["rope_parameters"] = {{"rope_type", "llama3"}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
       },
       "config.json: rope_parameters.factor: required key is missing"},
      {"rope-llama3-band", [](Json& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0}};
       },
       "config.json: rope_parameters.high_freq_factor: 1 is not above rope_parameters.low_freq_factor 4"},
      {"partial-rotary", [](Json& c) { c["partial_rotary_factor"] = 0.5; },
       "config.json: partial_rotary_factor: 0.5 is not supported"},
      {"router-jitter", [](Json& c) {
         c["model_type"] = "mixtral"; c["architectures"] = {"MixtralForCausalLM"}; c["router_jitter_noise"] = 0.1;
       },
       "config.json: router_jitter_noise: 0.1 is not supported"},
      {"attention-bias", [](Json& c) { c["attention_bias"] = true; }, "config.json: attention_bias: true is not supported"},
      {"mlp-bias", [](Json& c) { c["mlp_bias"] = true; }, "config.json: mlp_bias: true is not supported"},
      {"model-type", [](Json& c) { c["model_type"] = "gpt2"; }, "config.json: model_type: 'gpt2' is not supported"},
      {"architecture", [](Json& c) { c["architectures"] = {"Qwen2ForCausalLM"}; },
       "config.json: architectures: [\"Qwen2ForCausalLM\"] is not supported"},
      {"sliding-window", [](Json& c) { c["model_type"] = "mistral"; c["architectures"] = {"MistralForCausalLM"}; c["sliding_window"] = 0; },
       "config.json: sliding_window: 0 is less than 1"},
      {"activation", [](Json& c) { c["hidden_act"] = "gelu"; }, "config.json: hidden_act: 'gelu' is not supported"},
      {"head-dim", [](Json& c) { c["head_dim"] = 32; }, "config.json: head_dim: 32 is not hidden_size / num_attention_heads = 16"},
      // The model's own rules, as the training config checks them (spec/model_checks.h),
      // in config.json's names.
      {"heads", [](Json& c) { c["num_attention_heads"] = 5; },
       "config.json: num_attention_heads: 5 does not divide hidden_size 64; choose a divisor of 64"},
      {"kv-heads", [](Json& c) { c["num_key_value_heads"] = 3; },
       "config.json: num_key_value_heads: 3 does not divide num_attention_heads 4; choose a divisor of 4"},
      // (rope_parameters' theta would take precedence, as in transformers.)
      {"rope-theta", [](Json& c) { c["rope_theta"] = 0.0; c.erase("rope_parameters"); },
       "config.json: rope_theta: 0 is not positive"},
      {"missing-key", [](Json& c) { c.erase("hidden_size"); }, "config.json: hidden_size: required key is missing"},
      {"wrong-type", [](Json& c) { c["num_hidden_layers"] = "4"; }, "config.json: num_hidden_layers: expected an integer, got \"4\""},
  };
  for (const Case& c : cases) {
    const auto r = import(variant(c.name, c.edit));
    EXPECT_EQ(r.exit_code, 2) << c.name << ": " << r.output;
    EXPECT_CONTAINS(r.output, dir_ + "/" + c.name + "/" + c.message);
    EXPECT_FALSE(fs::exists(dir_ + "/" + c.name + "-ckpt/step-00000000")) << c.name;
  }
  // Mistral models import with their window (null: full attention) and export with it.
  for (const std::optional<int64_t> window : {std::optional<int64_t>(), std::optional<int64_t>(48)}) {
    const std::string name = window ? "mistral-window" : "mistral-no-window";
    const std::string hf = variant(name, [&](Json& c) {
      c["model_type"] = "mistral";
      c["architectures"] = {"MistralForCausalLM"};
      c["sliding_window"] = window ? Json(*window) : Json(nullptr);
    });
    const auto mistral = import(hf);
    ASSERT_EQ(mistral.exit_code, 0) << mistral.output;
    const auto back = run_trainer("export-hf " + hf + "-ckpt --output " + hf + "-back --dtype fp32");
    ASSERT_EQ(back.exit_code, 0) << back.output;
    const Json config = read_json(hf + "-back/config.json");
    EXPECT_EQ(config["model_type"], "mistral") << name;
    EXPECT_EQ(config["architectures"][0], "MistralForCausalLM") << name;
    EXPECT_EQ(config["sliding_window"], window ? Json(*window) : Json(nullptr)) << name;
  }
}

// LLaMA 3.x's RoPE scaling: read from transformers 5's rope_parameters (theta inside
// it) and from earlier versions' rope_theta + rope_scaling (original context falling
// back to max_position_embeddings, as transformers does), and written back both ways.
TEST_F(HfImportRefuses, RopeScalingLlama3BothWays) {
  const std::string v5 = variant("llama3-v5", [](Json& c) {
    c.erase("rope_theta");
    c.erase("rope_scaling");
    c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0},
                            {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}};
  });
  auto r = import(v5);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string yaml = file_text(v5 + "-ckpt/train-config.yaml");
  EXPECT_CONTAINS(yaml, "rope_theta: 500000");
  EXPECT_CONTAINS(yaml, "rope_scaling: \"llama3\"");
  EXPECT_CONTAINS(yaml, "rope_scaling_factor: 32");
  EXPECT_CONTAINS(yaml, "rope_high_freq_factor: 4");
  EXPECT_CONTAINS(yaml, "rope_original_max_positions: 64");
  r = run_trainer("export-hf " + v5 + "-ckpt --output " + v5 + "-back --dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Json back = read_json(v5 + "-back/config.json");
  const Json scaling = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  EXPECT_EQ(back["rope_scaling"], scaling);
  Json parameters = scaling;
  parameters["rope_theta"] = 500000.0;
  EXPECT_EQ(back["rope_parameters"], parameters);
  EXPECT_EQ(back["rope_theta"], 500000.0);

  const std::string legacy = variant("llama3-legacy", [](Json& c) {
    c["rope_theta"] = 500000.0;
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  });
  r = import(legacy);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  yaml = file_text(legacy + "-ckpt/train-config.yaml");
  EXPECT_CONTAINS(yaml, "rope_theta: 500000");
  EXPECT_CONTAINS(yaml, "rope_scaling_factor: 8");
  EXPECT_CONTAINS(yaml, "rope_original_max_positions: 128");  // max_position_embeddings

  // transformers 5's plain RoPE: the theta in rope_parameters, none beside it (the
  // import once took 10000 here).
  const std::string plain = variant("rope-parameters-theta", [](Json& c) {
    c.erase("rope_theta");
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  });
  r = import(plain);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  yaml = file_text(plain + "-ckpt/train-config.yaml");
  EXPECT_CONTAINS(yaml, "rope_theta: 1.0e+06");
  EXPECT_CONTAINS(yaml, "rope_scaling: \"none\"");
}

TEST_F(HfImportRefuses, WeightsThatDoNotFitTheConfig) {
  // A larger vocabulary than the file's embedding: the tensor and both shapes are named.
  auto r = import(variant("vocab", [](Json& c) { c["vocab_size"] = 300; }));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, dir_ + "/vocab/model.safetensors: tensor 'model.embed_tokens.weight' has shape [258, 64], "
                                   "config.json's model needs [300, 64]");
  // Fewer layers than the file holds: the first tensor of layer 3 is not a parameter.
  r = import(variant("layers", [](Json& c) { c["num_hidden_layers"] = 3; }));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "tensor 'model.layers.3.");
  EXPECT_CONTAINS(r.output, "is not a parameter of the LLaMA model config.json describes");
}

// Sizes in config.json are checked before the model they describe is built: a
// layer count above the model's limit (1e9 once took import-hf to 22.7 GB and the
// out-of-memory killer), and a model far larger than the weights the directory
// holds. Both exit 2 naming the file and the key.
TEST_F(HfImportRefuses, SizesBeyondWhatTheFilesHold) {
  auto r = import(variant("billion-layers", [](Json& c) { c["num_hidden_layers"] = 1000000000; }));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, dir_ + "/billion-layers/config.json: num_hidden_layers: 1000000000 is above 65536");
  r = import(variant("many-layers", [](Json& c) { c["num_hidden_layers"] = 60000; }));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, dir_ + "/many-layers/config.json: num_hidden_layers 60000, hidden_size 64, "
                                   "intermediate_size 128, vocab_size 258 describes a model of 2.22e+09 parameters, "
                                   "more than twice the ");
  EXPECT_FALSE(fs::exists(dir_ + "/many-layers-ckpt/step-00000000"));
}

// A NaN or infinity in the weights would train into NaN losses from the first step:
// refused, naming the file, the tensor and the element.
TEST_F(HfImportRefuses, NonFiniteWeights) {
  const std::string hf = variant("nan", [](Json&) {});
  const std::string file = hf + "/model.safetensors";
  uint64_t header = 0;
  {
    std::ifstream in(file, std::ios::binary);
    in.read(reinterpret_cast<char*>(&header), 8);
  }
  // lm_head.weight comes first in the data (tensors in name order); its element 5.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(8 + header + 5 * sizeof(float)));
    f.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
  }
  const auto r = import(hf);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, file + ": tensor 'lm_head.weight' holds a non-finite value (nan at element 5 of 16512)");
  EXPECT_FALSE(fs::exists(hf + "-ckpt/step-00000000"));
}

TEST_F(HfImportRefuses, BrokenSafetensorsFiles) {
  // Truncated: the last tensor's data is cut short.
  const std::string truncated = variant("truncated", [](Json&) {});
  fs::resize_file(truncated + "/model.safetensors", fs::file_size(truncated + "/model.safetensors") - 100);
  auto r = import(truncated);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // The checkpoint lists tensors by name, so the file's last one is model.norm.weight.
  EXPECT_CONTAINS(r.output, truncated + "/model.safetensors: tensor 'model.norm.weight': data_offsets end at byte");
  EXPECT_CONTAINS(r.output, "bytes of data: truncated");

  // Corrupted header: its first byte overwritten.
  const std::string corrupted = variant("corrupted", [](Json&) {});
  {
    std::fstream f(corrupted + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('#');
  }
  r = import(corrupted);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, corrupted + "/model.safetensors: the header is not valid JSON");

  // Mis-typed: a dtype name this reader does not take, written where "F32" was.
  const std::string mistyped = variant("mistyped", [](Json&) {});
  {
    std::fstream f(mistyped + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    std::string head(4096, '\0');
    f.read(head.data(), head.size());
    const size_t at = head.find("\"F32\"");
    ASSERT_NE(at, std::string::npos);
    f.clear();
    f.seekp(static_cast<std::streamoff>(at));
    f.write("\"I32\"", 5);
  }
  r = import(mistyped);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, mistyped + "/model.safetensors: tensor '");
  EXPECT_CONTAINS(r.output, "dtype I32 is not supported");
}

TEST(HfCheckpoint, CommandLineMistakes) {
  const std::string dir = scratch_dir("hf-usage");
  auto r = run_trainer("import-hf " + dir + "/nothing --output " + dir + "/out");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, dir + "/nothing: no such model directory");
  r = run_trainer("export-hf " + dir + " --output " + dir + "/out --dtype fp8");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--dtype 'fp8' is not one of bf16, fp32");
  r = run_trainer("export-hf " + dir + " --output " + dir + "/out");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "neither a checkpoint (no manifest.yaml) nor a directory holding complete checkpoints");
}

}  // namespace
}  // namespace hdp

namespace hdp {
namespace {

// train.init_from takes the weights of the config's model only: every differing
// shape key is refused with both values; numerics keys (here rope_theta, norm_eps,
// the architecture and the window) too, unless train.allow_model_change, which logs
// each. Once a checkpoint made with another window trained silently under the config's.
// A checkpoint written before train.checkpoint_when_busy was retired names it in its
// manifest's config, which holds every key of the build that wrote it: eval,
// export-hf and train.init_from read that config (config/config.h:
// parse_manifest_config) and still take the checkpoint.
TEST(HfCheckpoint, ACheckpointWhoseConfigNamesARetiredKeyStillEvaluatesExportsAndInitializes) {
  const std::string dir = scratch_dir("hf-retired-key");
  const std::string ckpt = trained_checkpoint(dir + "/run");
  Manifest manifest = read_manifest(ckpt);
  const size_t at = manifest.config.find("  checkpoint_every: 2\n");
  ASSERT_NE(at, std::string::npos) << manifest.config;
  manifest.config.insert(at, "  checkpoint_when_busy: defer\n");
  write_manifest(ckpt, manifest);
  ASSERT_NE(checkpoint_config(ckpt).find("checkpoint_when_busy: defer"), std::string::npos);

  auto r = run_trainer("eval " + ckpt + " --data " + small_corpus() + " --max-seq-len 64 --max-documents 8 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "predicted tokens: loss");
  r = run_trainer("export-hf " + ckpt + " --output " + dir + "/hf --dtype fp32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/hf/config.json"));
  EXPECT_NO_THROW(trained_checkpoint(dir + "/again", "--set train.init_from=" + ckpt));
}

TEST(InitFrom, RefusesAnotherModelNamingEachKey) {
  const std::string dir = scratch_dir("init-from");
  const std::string ckpt = trained_checkpoint(dir + "/run");
  int runs = 0;
  auto train = [&](const std::string& settings) {
    const std::string run = dir + "/from-" + std::to_string(runs++);
    return run_trainer("train " + kConfig + " --set data.path=" + small_corpus() + small_model_overrides() +
                       " --set train.steps=1 --set train.init_from=" + ckpt + " --set train.run_dir=" + run +
                       " --set train.checkpoint_dir=" + run + "/ckpt " + settings);
  };
  auto r = train("");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "initial weights from " + ckpt);

  const std::string numerics = "--set model.rope_theta=500000 --set model.norm_eps=1e-6 --set model.arch=mistral "
                               "--set model.sliding_window=96";
  r = train(numerics);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "train.init_from: " + ckpt + "'s model computes differently from this config's: "
                            "model.arch 'llama' (checkpoint) vs 'mistral' (config); model.rope_theta 10000 "
                            "(checkpoint) vs 500000 (config); model.norm_eps 1e-05 (checkpoint) vs 1e-06 (config); "
                            "model.sliding_window null (checkpoint) vs 96 (config); set these keys as the "
                            "checkpoint's model has them, or set train.allow_model_change: true");
  EXPECT_EQ(r.output.find("initial weights from"), std::string::npos) << r.output;

  r = train(numerics + " --set train.allow_model_change=true");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "train.init_from: model.rope_theta 10000 in " + ckpt + ", 500000 here");
  EXPECT_CONTAINS(r.output, "train.init_from: model.sliding_window null in " + ckpt + ", 96 here");
  EXPECT_CONTAINS(r.output, "initial weights from " + ckpt);

  // Shapes: never, whatever allow_model_change says.
  r = train("--set model.ffn_hidden_size=96 --set model.tie_embeddings=true --set train.allow_model_change=true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "train.init_from: " + ckpt + " holds the weights of another model: "
                            "model.ffn_hidden_size 128 (checkpoint) vs 96 (config); model.tie_embeddings false "
                            "(checkpoint) vs true (config); set these keys as the checkpoint's model has them");
  r = train(kMixtral);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "model.arch 'llama' (checkpoint) vs 'mixtral' (config); model.num_experts");
}

TEST(TokenizedData, TrainingRefusesAVocabularyLargerThanTheModel) {
  // A SentencePiece model of 600 pieces (spm_train on demo text), prepare-data
  // with it, then training: a 258-entry embedding is refused naming both sizes.
  const std::string dir = scratch_dir("hf-tokenized-data");
  {
    // Demo-corpus text, one plain file: it trains the tokenizer and is the data.
    std::ofstream text(dir + "/text.txt");
    CorpusOptions options;
    for (int64_t doc = 0; doc < 300; ++doc) text << generate_demo_document(options, doc) << "\n";
  }
  auto r = testing::run_command("spm_train --input=" + dir + "/text.txt --model_prefix=" + dir +
                           "/sp --vocab_size=600 --minloglevel=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_trainer("prepare-data --input " + dir + "/text.txt --output " + dir + "/data.h5 --tokenizer " + dir + "/sp.model");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "tokenizer sentencepiece sp.model fnv1a64:");

  const std::string base = "train " + kConfig + " --set data.path=" + dir + "/data.h5 --set train.run_dir=" + dir +
                           "/run --set train.steps=1 --set train.checkpoint_every=0" + small_model_overrides();
  r = run_trainer(base);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "model.vocab_size: 258 is too small for data.path '" + dir +
                                "/data.h5', whose tokenizer's vocabulary has 600 entries");
  r = run_trainer(base + " --set model.vocab_size=600");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(TokenizedData, MegatronFilesTrainLikeTheHdf5Dataset) {
  // The same documents as PREFIX.bin/.idx (data.format megatron) and as our HDF5
  // file: the same batches, so the same losses, bit for bit.
  const std::string dir = scratch_dir("hf-megatron-training");
  {
    std::ofstream jsonl(dir + "/docs.jsonl");
    CorpusOptions options;
    for (int64_t doc = 0; doc < 200; ++doc) jsonl << jsonl_record(generate_demo_document(options, doc));
  }
  auto r = run_trainer("prepare-data --input " + dir + "/docs.jsonl --output " + dir + "/docs.h5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_trainer("prepare-data --input " + dir + "/docs.jsonl --output " + dir + "/docs --output-format megatron");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(dir + "/docs.bin") && fs::exists(dir + "/docs.idx"));
  auto losses = [&](const std::string& name, const std::string& data) {
    auto t = run_trainer("train " + kConfig + " --set train.run_dir=" + dir + "/" + name + " --set train.steps=3" +
                         " --set train.checkpoint_every=0" + small_model_overrides() + " " + data);
    EXPECT_EQ(t.exit_code, 0) << t.output;
    return testing::metric_values(dir + "/" + name, "loss");
  };
  const auto hdf5 = losses("hdf5", "--set data.path=" + dir + "/docs.h5");
  const auto megatron = losses("megatron", "--set data.path=" + dir + "/docs --set data.format=megatron");
  ASSERT_EQ(hdf5.size(), 3u);
  EXPECT_EQ(megatron, hdf5);
  // A prefix without its files is named with the key.
  r = run_trainer("train " + kConfig + " --set data.path=" + dir + "/nothing --set data.format=megatron");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "data.path: file '" + dir + "/nothing.bin' does not exist");
}

TEST(Eval, LossEqualsTheReferenceModel) {
  // trainer eval of a trained checkpoint against tests/reference_llama.h (a naive
  // double-precision LLaMA) on the same pieces: documents cut at 32 tokens.
  const std::string dir = scratch_dir("hf-eval");
  const std::string ckpt = trained_checkpoint(dir + "/run");
  {
    std::ofstream jsonl(dir + "/heldout.jsonl");
    CorpusOptions options;
    options.seed = 4321;
    for (int64_t doc = 0; doc < 6; ++doc) jsonl << jsonl_record(generate_demo_document(options, doc).substr(0, 20 + 13 * doc));
  }
  auto r = run_trainer("prepare-data --input " + dir + "/heldout.jsonl --output " + dir + "/heldout.h5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The run's checkpoint directory: eval takes its newest checkpoint.
  r = run_trainer("eval " + dir + "/run/ckpt --data " + dir + "/heldout.h5 --max-seq-len 32 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"((\d+) predicted tokens: loss ([0-9.]+), perplexity ([0-9.]+))")))
      << r.output;
  EXPECT_CONTAINS(r.output, "step 2");
  const int64_t predicted = std::stoll(m[1]);
  const double loss = std::stod(m[2]), perplexity = std::stod(m[3]);

  ModelConfig c;
  c.hidden_size = 64, c.num_layers = 4, c.num_heads = 4, c.num_kv_heads = 2, c.ffn_hidden_size = 128;
  c.vocab_size = 258, c.norm_eps = 1e-5, c.rope_theta = 10000;
  testing::Weights w;
  for (const auto& [name, values] : weights_of(ckpt, dir + "/weights.h5")) w[name] = std::vector<double>(values.begin(), values.end());
  TokenDataset data(dir + "/heldout.h5");
  double sum = 0;
  int64_t count = 0;
  for (int64_t d = 0; d < data.num_documents(); ++d) {
    const std::vector<int32_t> doc = data.read_document(d);
    for (size_t at = 0; at < doc.size(); at += 32) {
      const size_t n = std::min<size_t>(32, doc.size() - at);
      if (n < 2) continue;
      testing::ReferenceBatch b;
      for (size_t i = 0; i < n; ++i) {
        b.tokens.push_back(doc[at + i]);
        b.targets.push_back(i + 1 < n ? doc[at + i + 1] : -1);
        b.positions.push_back(static_cast<int32_t>(i));
      }
      b.cu_seqlens = {0, static_cast<int32_t>(n)};
      sum += testing::reference_loss(c, w, b);
      count += static_cast<int64_t>(n) - 1;
    }
  }
  EXPECT_EQ(predicted, count);
  EXPECT_NEAR(loss, sum / static_cast<double>(count), 1e-5 * loss);
  EXPECT_NEAR(perplexity, std::exp(sum / static_cast<double>(count)), 1e-4 * perplexity);
}

TEST(Generate, GreedyTokensAreTheReferenceModelsArgmax) {
  // Each greedy token is the one tests/reference_llama.h finds most likely after
  // the context so far (the candidate with the smallest cross-entropy).
  const std::string dir = scratch_dir("hf-generate");
  const std::string ckpt = trained_checkpoint(dir + "/run", "--set train.steps=2");
  const std::string prompt = "Where does Clara live?";
  auto r = run_trainer("generate " + ckpt + " --prompt '" + prompt + "' --max-new-tokens 3 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find(prompt + "");
  ASSERT_NE(at, std::string::npos) << r.output;

  ModelConfig c;
  c.hidden_size = 64, c.num_layers = 4, c.num_heads = 4, c.num_kv_heads = 2, c.ffn_hidden_size = 128;
  c.vocab_size = 258, c.norm_eps = 1e-5, c.rope_theta = 10000;
  testing::Weights w;
  for (const auto& [name, values] : weights_of(ckpt, dir + "/weights.h5")) w[name] = std::vector<double>(values.begin(), values.end());
  std::vector<int32_t> context(prompt.begin(), prompt.end());  // byte-level ids, no BOS
  std::string want;
  for (int step = 0; step < 3; ++step) {
    testing::ReferenceBatch b;
    b.tokens = context;
    b.targets.assign(context.size(), -1);
    for (size_t i = 0; i < context.size(); ++i) b.positions.push_back(static_cast<int32_t>(i));
    b.cu_seqlens = {0, static_cast<int32_t>(context.size())};
    int32_t best = -1;
    double best_loss = 0;
    for (int32_t v = 0; v < 258; ++v) {
      b.targets.back() = v;
      const double loss = testing::reference_loss(c, w, b);
      if (best < 0 || loss < best_loss) best = v, best_loss = loss;
    }
    ASSERT_LT(best, 256) << "the reference picks BOS or EOS at step " << step;
    want += static_cast<char>(best);
    context.push_back(best);
  }
  EXPECT_EQ(r.output.substr(at, prompt.size() + 3), prompt + want) << r.output;

  // Sampling: the same seed repeats itself; a top-p too small for a second token is greedy.
  const std::string sample = "generate " + ckpt + " --prompt '" + prompt + "' --max-new-tokens 20 --threads 1 --temperature 1.5";
  auto a = run_trainer(sample + " --seed 7"), b = run_trainer(sample + " --seed 7");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output.substr(a.output.find(prompt)), b.output.substr(b.output.find(prompt)));
  auto g = run_trainer("generate " + ckpt + " --prompt '" + prompt + "' --max-new-tokens 3 --threads 1 --temperature 1 --top-p 1e-9");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_EQ(g.output.substr(g.output.find(prompt), prompt.size() + 3), prompt + want);
  // Bad values are named.
  auto bad = run_trainer("generate " + ckpt + " --prompt x --top-p 0");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_CONTAINS(bad.output, "--top-p must be in (0, 1]");
}

}  // namespace
}  // namespace hdp

namespace hdp {
namespace {

// The tokenizer travels (data/tokenizer_files.h, checkpoint/tokenizer_copy.h): a
// SentencePiece model of 600 pieces (spm_train on demo text) makes the data;
// training copies it into the checkpoint; generate uses it without --tokenizer;
// eval, init_from and resuming refuse byte-level data naming both tokenizers; export-hf
// writes tokenizer.model and its ids, import-hf reads them back; a changed copy
// and a checkpoint that records none are refused with what to do.
TEST(TokenizerTravels, FromDataToCheckpointToHuggingFaceAndBack) {
  const std::string dir = scratch_dir("hf-tokenizer-travels");
  {
    std::ofstream text(dir + "/text.txt"), jsonl(dir + "/docs.jsonl");
    CorpusOptions options;
    for (int64_t doc = 0; doc < 300; ++doc) {
      text << generate_demo_document(options, doc) << "\n";
      if (doc < 40) jsonl << jsonl_record(generate_demo_document(options, doc));
    }
  }
  auto r = testing::run_command("spm_train --input=" + dir + "/text.txt --model_prefix=" + dir +
                                "/sp --vocab_size=600 --minloglevel=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::run_command("echo -n 'the model' | spm_encode --model=" + dir + "/sp.model --output_format=id");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream prompt_ids(r.output);
  size_t prompt_tokens = 1;  // BOS
  for (std::string id; prompt_ids >> id;) ++prompt_tokens;
  r = run_trainer("prepare-data --input " + dir + "/docs.jsonl --output " + dir + "/sp.h5 --tokenizer " + dir + "/sp.model");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_trainer("prepare-data --input " + dir + "/docs.jsonl --output " + dir + "/bytes.h5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string train = "train " + kConfig + " --set model.vocab_size=600 --set train.run_dir=" + dir +
                            "/run --set train.steps=2 --set train.checkpoint_every=2" + small_model_overrides();
  r = run_trainer(train + " --set data.path=" + dir + "/sp.h5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = dir + "/run/checkpoints/step-00000002";
  const std::string identity = file_text(ckpt + "/tokenizer/identity");
  ASSERT_EQ(identity.rfind("sentencepiece sp.model fnv1a64:", 0), 0u) << identity;
  EXPECT_CONTAINS(file_text(ckpt + "/manifest.yaml"), "tokenizer: " + identity.substr(0, identity.size() - 1) + "\n");
  EXPECT_EQ(file_text(ckpt + "/tokenizer/sp.model"), file_text(dir + "/sp.model"));

  // generate: the checkpoint's SentencePiece model, not bytes.
  r = run_trainer("generate " + dir + "/run/checkpoints --prompt 'the model' --max-new-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "tokenizer sentencepiece sp.model fnv1a64:");
  EXPECT_CONTAINS(r.output, "prompt " + std::to_string(prompt_tokens) + " tokens");
  r = run_trainer("generate " + ckpt + " --prompt 'the model' --max-new-tokens 4 --tokenizer byte-level");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--tokenizer byte-level is tokenizer 'byte-level', but " + ckpt +
                                " was trained with tokenizer 'sentencepiece sp.model fnv1a64:");

  // eval and init_from: byte-level data is refused, naming both tokenizers.
  r = run_trainer("eval " + ckpt + " --data " + dir + "/bytes.h5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "the data '" + dir + "/bytes.h5' was made with tokenizer 'byte-level', but " + ckpt +
                                " was trained with tokenizer 'sentencepiece sp.model fnv1a64:");
  EXPECT_CONTAINS(r.output, "trainer prepare-data --tokenizer " + ckpt + "/tokenizer/sp.model");
  r = run_trainer("eval " + ckpt + " --data " + dir + "/sp.h5 --max-documents 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_trainer(train + " --set data.path=" + dir + "/bytes.h5 --set train.run_dir=" + dir +
                  "/run2 --set train.init_from=" + ckpt);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "train.init_from: the data '" + dir + "/bytes.h5' was made with tokenizer 'byte-level'");
  // Resuming the run on another tokenizer's data (told to continue it under another
  // data.path): the same refusal.
  r = run_trainer(train + " --set data.path=" + dir + "/bytes.h5 --set train.resume=auto --set train.reuse_checkpoint_dir=true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "resuming: the data '" + dir + "/bytes.h5' was made with tokenizer 'byte-level', but " +
                                ckpt + " was trained with tokenizer 'sentencepiece sp.model fnv1a64:");

  // export-hf: tokenizer.model, its special pieces and ids; a contradicting id is refused.
  r = run_trainer("export-hf " + ckpt + " --output " + dir + "/hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(file_text(dir + "/hf/tokenizer.model"), file_text(dir + "/sp.model"));
  const Json tokenizer_config = read_json(dir + "/hf/tokenizer_config.json");
  EXPECT_EQ(tokenizer_config["bos_token"], "<s>");
  EXPECT_EQ(tokenizer_config["eos_token"], "</s>");
  EXPECT_EQ(read_json(dir + "/hf/config.json")["bos_token_id"], 1);  // spm_train's defaults
  EXPECT_EQ(read_json(dir + "/hf/config.json")["eos_token_id"], 2);
  EXPECT_EQ(read_json(dir + "/hf/generation_config.json")["eos_token_id"], 2);
  r = run_trainer("export-hf " + ckpt + " --output " + dir + "/hf-bad --eos-id 257");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "--eos-id 257 contradicts the checkpoint's tokenizer 'sentencepiece sp.model");

  // import-hf: the directory's tokenizer.model becomes the checkpoint's; the same
  // tokenizer under another file name is accepted by eval.
  r = run_trainer("import-hf " + dir + "/hf --output " + dir + "/imported");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string imported = dir + "/imported/step-00000000";
  EXPECT_EQ(file_text(imported + "/tokenizer/identity"),
            "sentencepiece tokenizer.model " + identity.substr(identity.find("fnv1a64:")));
  EXPECT_EQ(file_text(imported + "/tokenizer/tokenizer.model"), file_text(dir + "/sp.model"));
  r = run_trainer("eval " + imported + " --data " + dir + "/sp.h5 --max-documents 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // A changed copy is refused naming both hashes.
  {
    std::ofstream(imported + "/tokenizer/tokenizer.model", std::ios::app) << "x";
  }
  r = run_trainer("generate " + imported + " --prompt 'the model' --max-new-tokens 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, "the copy was changed");

  // A checkpoint that records no tokenizer (as written before) and is not byte-level.
  const std::string manifest = file_text(ckpt + "/manifest.yaml");
  {
    std::ofstream out(ckpt + "/manifest.yaml");
    out << std::regex_replace(manifest, std::regex("tokenizer: [^\n]*\n"), "");
  }
  fs::remove_all(ckpt + "/tokenizer");
  r = run_trainer("generate " + ckpt + " --prompt 'the model' --max-new-tokens 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_CONTAINS(r.output, ckpt + " records no tokenizer (it was written before checkpoints kept one) and its "
                                   "model.vocab_size is 600, not the byte-level 258: pass the tokenizer");
  r = run_trainer("generate " + ckpt + " --prompt 'the model' --max-new-tokens 1 --tokenizer " + dir + "/sp.model");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "prompt " + std::to_string(prompt_tokens) + " tokens");
}

}  // namespace
}  // namespace hdp
