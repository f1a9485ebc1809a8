#include "checkpoint/hf_checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/yaml_reader.h"
#include "checkpoint/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "kernels/ops.h"
#include "checkpoint/checkpoint_error.h"
#include "checkpoint/directory.h"
#include "checkpoint/export.h"
#include "checkpoint/protocol.h"
#include "config/config.h"
#include "config/model_agreement.h"
#include "model/model.h"
#include "spec/model_checks.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

Json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_config_error(path, "", std::string("cannot open ") + what + ": " + std::strerror(errno), "");
  try {
    return Json::parse(in);
  } catch (const Json::exception& e) {
    throw_config_error(path, "", std::string("not valid JSON (") + e.what() + ")", "");
  }
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!(out << std::flush)) throw CheckpointError(tmp + ": cannot write");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw CheckpointError(path + ": renaming " + tmp + " failed: " + ec.message());
}

// Typed access to config.json's keys; every error names the file and the key.
class HfConfigReader {
 public:
  // prefix: where `root` is in the file ("rope_parameters."), for the messages.
  HfConfigReader(const std::string& path, const Json& root, std::string prefix = "")
      : path_(path), root_(root), prefix_(std::move(prefix)) {
    if (!root_.is_object())
      fail(prefix_.empty() ? "(top level)" : "", "expected a JSON object, got " + root_.dump(), "");
  }
  // Present and not null.
  bool has(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }
  const Json& at(const char* key) const { return root_[key]; }
  const std::string& path() const { return path_; }

  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt, int64_t minimum = 1) const {
    if (!has(key)) {
      if (!fallback) fail(key, "required key is missing", "");
      return *fallback;
    }
    const Json& v = root_[key];
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump(), "");
    const int64_t x = v.get<int64_t>();
    if (x < minimum) fail(key, std::to_string(x) + " is less than " + std::to_string(minimum), "");
    return x;
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& v = root_[key];
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump(), "");
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& v = root_[key];
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump(), "");
    return v.get<bool>();
  }
  std::string string(const char* key, std::optional<std::string> fallback = std::nullopt) const {
    if (!has(key)) {
      if (!fallback) fail(key, "required key is missing", "");
      return *fallback;
    }
    const Json& v = root_[key];
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump(), "");
    return v.get<std::string>();
  }
  // A token id: an integer, or a list of them (the first counts), or null.
  std::optional<int64_t> token_id(const char* key) const {
    if (!has(key)) return std::nullopt;
    const Json& v = root_[key];
    const Json& first = v.is_array() && !v.empty() ? v[0] : v;
    if (!first.is_number_integer() || first.get<int64_t>() < 0)
      fail(key, "expected a non-negative token id (or a list of them), got " + v.dump(), "");
    return first.get<int64_t>();
  }
  [[noreturn]] void fail(const std::string& key, const std::string& problem, const std::string& valid) const {
    throw_config_error(path_, key.empty() ? prefix_.substr(0, prefix_.size() - 1) : prefix_ + key, problem, valid);
  }
  // Refuses a key outside `known`, naming it: a setting this build would otherwise ignore.
  void only(const std::set<std::string>& known, const std::string& valid) const {
    for (const auto& [key, value] : root_.items())
      if (!known.count(key)) fail(key, value.dump() + " is not supported", valid);
  }

 private:
  std::string path_;
  const Json& root_;
  std::string prefix_;
};

// RoPE as config.json gives it, read as transformers 5 reads it: the dict of
// `rope_scaling` (older files) when not null, else of `rope_parameters` (newer
// ones); its rope_theta, else the top-level `rope_theta`, else 10000. Types this
// build does not implement are refused, naming the key and the value.
void read_rope(const HfConfigReader& c, RopeSettings& rope) {
  // transformers reads it beside the dict or inside it.
  auto whole_head = [](const HfConfigReader& r) {
    if (r.number("partial_rotary_factor", 1.0) != 1.0)
      r.fail("partial_rotary_factor", r.at("partial_rotary_factor").dump() + " is not supported",
             "this build rotates the whole head (1.0)");
  };
  whole_head(c);
  rope.rope_theta = c.number("rope_theta", 10000.0);
  const char* dict_key = c.has("rope_scaling") ? "rope_scaling" : c.has("rope_parameters") ? "rope_parameters" : nullptr;
  if (dict_key == nullptr) return;
  const HfConfigReader d(c.path(), c.at(dict_key), std::string(dict_key) + ".");
  const char* type_key = d.has("rope_type") ? "rope_type" : "type";  // "type": transformers before 4.45
  const std::string type = d.string(type_key, "default");
  const std::string implemented = "this build implements rope_type 'default' and 'llama3'";
  if (type != "default" && type != "llama3") d.fail(type_key, "'" + type + "' is not supported", implemented);
  std::set<std::string> known = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "llama3")
    known.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  d.only(known, implemented + " and no other key of it");
  whole_head(d);
  rope.rope_theta = d.number("rope_theta", rope.rope_theta);
  if (type == "default") return;
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"})
    if (!d.has(key)) d.fail(key, "required key is missing", "rope_type 'llama3' needs it");
  rope.rope_scaling = RopeScaling::Llama3;
  rope.rope_scaling_factor = d.number("factor", 0);
  rope.rope_low_freq_factor = d.number("low_freq_factor", 0);
  rope.rope_high_freq_factor = d.number("high_freq_factor", 0);
  // transformers takes max_position_embeddings when the dict lacks it.
  rope.rope_original_max_positions =
      d.has("original_max_position_embeddings") ? d.integer("original_max_position_embeddings")
                                                : c.integer("max_position_embeddings", 2048, 2);
}

// config.json's names (LlamaConfig, MistralConfig, MixtralConfig; RoPE's factors as
// transformers 5 writes them) of the model keys the model's
// rules (spec/model_checks.h) can name, for its messages.
const KeyWording kHfKeyWording{
    [](const std::string& key) -> std::string {
      static const std::map<std::string, std::string> names = {
          {"model.arch", "model_type"},
          {"model.vocab_size", "vocab_size"},
          {"model.hidden_size", "hidden_size"},
          {"model.num_layers", "num_hidden_layers"},
          {"model.num_heads", "num_attention_heads"},
          {"model.num_kv_heads", "num_key_value_heads"},
          {"model.ffn_hidden_size", "intermediate_size"},
          {"model.rope_theta", "rope_theta"},
          {"model.norm_eps", "rms_norm_eps"},
          {"model.init_std", "initializer_range"},
          {"model.sliding_window", "sliding_window"},
          {"model.rope_scaling_factor", "rope_parameters.factor"},
          {"model.rope_low_freq_factor", "rope_parameters.low_freq_factor"},
          {"model.rope_high_freq_factor", "rope_parameters.high_freq_factor"},
          {"model.rope_original_max_positions", "rope_parameters.original_max_position_embeddings"},
          {"model.num_experts", "num_local_experts"},
          {"model.experts_per_token", "num_experts_per_tok"},
          {"model.router_aux_loss_coef", "router_aux_loss_coef"}};
      const auto it = names.find(key);
      return it == names.end() ? key : it->second;
    },
    {}};

// The whole model as one rank holds it: a conversion tool's view of the weights.
std::unique_ptr<LlamaModel> whole_model(const ModelConfig& config) {
  return std::make_unique<LlamaModel>(config, /*capacity_tokens=*/1);
}

// Which file holds each tensor: the index of a sharded model, or the one file.
std::map<std::string, std::string> weight_files(const std::string& hf_dir) {
  const fs::path dir(hf_dir);
  std::map<std::string, std::string> files;
  const std::string index = (dir / kIndexFile).string();
  std::error_code ec;
  if (fs::exists(index, ec)) {
    const Json root = read_json_file(index, "the safetensors index");
    if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object())
      throw_config_error(index, "weight_map", "missing or not an object of tensor name -> file", "");
    for (const auto& [name, file] : root["weight_map"].items()) {
      if (!file.is_string()) throw_config_error(index, "weight_map." + name, "expected a file name, got " + file.dump(), "");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        throw_config_error(index, "weight_map." + name, "'" + f + "' is not a file name in the model directory", "");
      files[name] = (dir / f).string();
    }
    if (files.empty()) throw_config_error(index, "weight_map", "lists no tensors", "");
    return files;
  }
  const std::string single = (dir / kSingleFile).string();
  if (!fs::exists(single, ec)) {
    for (const char* bin : {"pytorch_model.bin", "pytorch_model.bin.index.json"}) {
      if (fs::exists(dir / bin, ec))
        throw CheckpointError(hf_dir + ": holds " + bin + " (PyTorch pickle), which this trainer does not read; "
                              "save the model as safetensors (save_pretrained(..., safe_serialization=True))");
    }
    throw CheckpointError(hf_dir + ": neither " + kSingleFile + " nor " + kIndexFile + " found");
  }
  SafetensorsReader reader(single);
  for (const SafetensorsTensor& t : reader.tensors()) files[t.name] = single;
  return files;
}

bool is_rotary_buffer(const std::string& name) {
  const std::string suffix = ".rotary_emb.inv_freq";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The config stored in the imported checkpoint: the model config.json describes,
// the data section's stand-ins and the overrides; data.max_seq_len is the context
// the model was trained for. An override may change training's settings, never the
// model the weights are (config/model_agreement.h).
Config imported_config(const HfModelConfig& hf, const std::string& source, const std::vector<std::string>& overrides) {
  const std::string data =
      "data:\n"
      // A stand-in that training configs replace: the import has no dataset.
      "  path: data-cache/dataset.h5\n"
      "  max_seq_len: " + std::to_string(hf.max_position_embeddings) + "\n"
      "  global_batch_tokens: " + std::to_string(std::max<int64_t>(4096, hf.max_position_embeddings)) + "\n";
  Config described = parse_config_text(data, source, {}, /*check_files=*/false);
  described.model = hf.model;
  Config config = parse_config_text(emit_config_yaml(described), source, overrides, /*check_files=*/false);
  const std::vector<ModelKeyDifference> changed = model_differences(described, config);
  if (!changed.empty())
    throw UsageError("--set " + changed.front().key + " changes the model that " + source + " describes (" +
                     describe_model_differences(changed, "config.json", "--set") +
                     "); the weights fix the model's shape and numerics");
  return config;
}

// config.json of a model: what transformers' LlamaConfig, MistralConfig and
// MixtralConfig read, every key that changes the numerics explicit. RoPE is written
// both as transformers 5 writes it (rope_parameters) and as earlier versions read it
// (rope_theta, rope_scaling); transformers 5 reads either.
OrderedJson hf_config_json(const ModelConfig& m, int64_t max_positions, const char* torch_dtype) {
  const char* architecture = m.moe() ? "MixtralForCausalLM" : m.arch == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM";
  OrderedJson rope = {{"rope_theta", m.rope_theta}, {"rope_type", "default"}};
  OrderedJson scaling = nullptr;
  if (m.rope_scaling == RopeScaling::Llama3) {
    scaling = {{"rope_type", "llama3"},
               {"factor", m.rope_scaling_factor},
               {"low_freq_factor", m.rope_low_freq_factor},
               {"high_freq_factor", m.rope_high_freq_factor},
               {"original_max_position_embeddings", m.rope_original_max_positions}};
    rope = scaling;
    rope["rope_theta"] = m.rope_theta;
  }
  OrderedJson cfg = {
      {"architectures", {architecture}},
      {"model_type", m.arch},
      {"torch_dtype", torch_dtype},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", m.ffn_hidden_size},
      {"num_hidden_layers", m.num_layers},
      {"num_attention_heads", m.num_heads},
      {"num_key_value_heads", m.num_kv_heads},
      {"head_dim", m.head_dim()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", max_positions},
      {"rms_norm_eps", m.norm_eps},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", scaling},
      {"rope_parameters", rope},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"pretraining_tp", 1},
      {"tie_word_embeddings", m.tie_embeddings},
      {"initializer_range", m.init_std},
      {"use_cache", true},
  };
  if (m.arch != "llama") cfg["sliding_window"] = m.sliding_window ? OrderedJson(*m.sliding_window) : OrderedJson(nullptr);
  if (m.moe()) {
    cfg["num_local_experts"] = m.num_experts;
    cfg["num_experts_per_tok"] = m.experts_per_token;
    cfg["router_aux_loss_coef"] = m.router_aux_loss_coef;
    cfg["router_jitter_noise"] = 0.0;
    // Inference's loss without the load-balancing term, as Mixtral's own config.json.
    cfg["output_router_logits"] = false;
  }
  return cfg;
}

}  // namespace

HfModelConfig read_hf_config(const std::string& path) {
  const Json root = read_json_file(path, "the model config");
  const HfConfigReader c(path, root);
  HfModelConfig hf;
  ModelConfig& m = hf.model;

  const std::string model_type = c.string("model_type");
  // Mistral is LLaMA plus an optional sliding window (Jiang et al. 2023); Mixtral is
  // Mistral with a sparse mixture of experts in place of each MLP (Jiang et al. 2024).
  if (model_type != "llama" && model_type != "mistral" && model_type != "mixtral")
    c.fail("model_type", "'" + model_type + "' is not supported", "this build imports 'llama', 'mistral' and 'mixtral'");
  if (c.has("architectures")) {
    const Json& a = c.at("architectures");
    const std::set<std::string> known = {"LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"};
    if (!a.is_array() || a.size() != 1 || !a[0].is_string() || !known.count(a[0].get<std::string>()))
      c.fail("architectures", a.dump() + " is not supported", "this build imports [\"LlamaForCausalLM\"], "
             "[\"MistralForCausalLM\"] and [\"MixtralForCausalLM\"]");
  }
  read_rope(c, m);
  if (c.boolean("attention_bias", false))
    c.fail("attention_bias", "true is not supported", "the model has no biases (attention_bias: false)");
  if (c.boolean("mlp_bias", false))
    c.fail("mlp_bias", "true is not supported", "the model has no biases (mlp_bias: false)");
  if (const std::string act = c.string("hidden_act", "silu"); act != "silu")
    c.fail("hidden_act", "'" + act + "' is not supported", "the MLP is SwiGLU (hidden_act: silu)");
  if (c.number("attention_dropout", 0.0) != 0.0)
    c.fail("attention_dropout", c.at("attention_dropout").dump() + " is not supported", "training has no dropout (0.0)");

  m.arch = model_type;
  // Hugging Face writes null (or leaves the key out) for full attention.
  if (model_type != "llama" && c.has("sliding_window")) m.sliding_window = c.integer("sliding_window", std::nullopt, 1);
  if (m.moe()) {
    // MixtralConfig's defaults. Its router (MixtralTopKRouter: softmax over every
    // expert in fp32, the top k, renormalised over the k) is model/moe.h's.
    m.num_experts = c.integer("num_local_experts", 8);
    m.experts_per_token = c.integer("num_experts_per_tok", 2);
    m.router_aux_loss_coef = c.number("router_aux_loss_coef", 0.001);
    if (c.number("router_jitter_noise", 0.0) != 0.0)
      c.fail("router_jitter_noise", c.at("router_jitter_noise").dump() + " is not supported",
             "training multiplies no noise into the router's input (0.0)");
  }
  m.hidden_size = c.integer("hidden_size");
  m.ffn_hidden_size = c.integer("intermediate_size");
  m.num_layers = c.integer("num_hidden_layers");
  m.num_heads = c.integer("num_attention_heads");
  m.num_kv_heads = c.integer("num_key_value_heads", m.num_heads);
  m.vocab_size = c.integer("vocab_size");
  m.norm_eps = c.number("rms_norm_eps", 1e-6);  // LlamaConfig's default
  m.tie_embeddings = c.boolean("tie_word_embeddings", false);
  m.init_std = c.number("initializer_range", m.init_std);
  // The model's own rules, as the training config and `trainer plan` check them.
  if (const std::optional<ModelIssue> issue = model_issue(m, kHfKeyWording))
    c.fail(kHfKeyWording.name_of(issue->key), issue->problem, issue->valid);
  if (c.has("head_dim") && c.integer("head_dim") != m.head_dim())
    c.fail("head_dim", std::to_string(c.integer("head_dim")) + " is not hidden_size / num_attention_heads = " +
           std::to_string(m.head_dim()), "this build's attention has head_dim = hidden_size / num_attention_heads");
  hf.max_position_embeddings = c.integer("max_position_embeddings", 2048, 2);
  hf.bos_token_id = c.token_id("bos_token_id");
  hf.eos_token_id = c.token_id("eos_token_id");
  return hf;
}

std::string import_hf(const std::string& hf_dir, const std::string& checkpoint_dir,
                      const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!fs::is_directory(hf_dir, ec)) throw CheckpointError(hf_dir + ": no such model directory");
  if (fs::exists(checkpoint_dir, ec) && !fs::is_empty(checkpoint_dir, ec))
    throw UsageError("--output '" + checkpoint_dir + "' is not empty; import into a new directory");

  const std::string config_json = (fs::path(hf_dir) / "config.json").string();
  const HfModelConfig hf = read_hf_config(config_json);
  const Config config = imported_config(hf, config_json, overrides);
  const std::map<std::string, std::string> files = weight_files(hf_dir);

  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  auto reader_of = [&](const std::string& file) -> SafetensorsReader& {
    auto& r = readers[file];
    if (!r) r = std::make_unique<SafetensorsReader>(file);
    return *r;
  };
  // config.json alone sizes the model's tables and weights, and each tensor is
  // compared with the model's only once the model is built. So config.json is
  // first checked against what the weight files hold (their headers are checked
  // against their sizes): a model of more than twice as many parameters as the
  // files have values is refused before it is built, which bounds what a small
  // directory can make this allocate.
  uint64_t values_held = 0;
  for (const auto& [name, file] : files)
    if (const SafetensorsTensor* t = reader_of(file).find(name)) values_held += static_cast<uint64_t>(t->numel());
  const ModelShape shape = config.model.shape();
  const double parameters = static_cast<double>(shape.layers) * layer_parameters(shape) +
                            embedding_parameters(shape) + head_parameters(shape, 1);
  if (parameters > 2 * static_cast<double>(values_held)) {
    char counts[200];
    std::snprintf(counts, sizeof(counts),
                  "describes a model of %.4g parameters, more than twice the %.4g values the weights in %s hold",
                  parameters, static_cast<double>(values_held), hf_dir.c_str());
    throw CheckpointError(config_json + ": num_hidden_layers " + std::to_string(shape.layers) + ", hidden_size " +
                          std::to_string(shape.hidden) + ", intermediate_size " + std::to_string(shape.ffn) +
                          ", vocab_size " + std::to_string(shape.vocab) + " " + counts +
                          ": config.json does not describe these weights");
  }

  std::unique_ptr<LlamaModel> model = whole_model(config.model);
  auto tensor_in = [&](const std::string& name) -> std::pair<SafetensorsReader*, const SafetensorsTensor*> {
    auto it = files.find(name);
    if (it == files.end()) return {nullptr, nullptr};
    SafetensorsReader& r = reader_of(it->second);
    const SafetensorsTensor* t = r.find(name);
    if (t == nullptr)
      throw CheckpointError(it->second + ": tensor '" + name + "' is missing (" + kIndexFile + " lists it in this file)");
    return {&r, t};
  };

  std::set<std::string> used;
  for (const ParameterInfo& p : model->parameters()) {
    auto [reader, t] = tensor_in(p.name);
    if (t == nullptr)
      throw CheckpointError(hf_dir + ": tensor '" + p.name + "' " + shape_text(p.global_shape) +
                            " is missing from the weights");
    if (t->shape != p.global_shape)
      throw CheckpointError(reader->path() + ": tensor '" + p.name + "' has shape " + shape_text(t->shape) +
                            ", config.json's model needs " + shape_text(p.global_shape));
    const std::vector<float> values = reader->read_floats(*t);
    // A NaN or infinity would train into NaN losses from the first step on.
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        throw CheckpointError(reader->path() + ": tensor '" + p.name + "' holds a non-finite value (" +
                              std::to_string(values[i]) + " at element " + std::to_string(i) + " of " +
                              std::to_string(values.size()) + "): the weights are corrupt");
      }
    }
    copy(model->parameter_tensor(p), Tensor(const_cast<float*>(values.data()), {p.numel}, Device::CPU));
    used.insert(p.name);
  }
  for (const auto& [name, file] : files) {
    if (used.count(name)) continue;
    if (is_rotary_buffer(name)) continue;  // RoPE's cached frequencies: recomputed from rope_theta
    if (name == "lm_head.weight" && config.model.tie_embeddings) {
      // Some tied models store the head anyway; it must be the embedding.
      auto [reader, head] = tensor_in(name);
      auto [embed_reader, embed] = tensor_in("model.embed_tokens.weight");
      if (head->shape != embed->shape || reader->read_floats(*head) != embed_reader->read_floats(*embed))
        throw CheckpointError(file + ": tensor 'lm_head.weight' differs from 'model.embed_tokens.weight', but "
                              "config.json says tie_word_embeddings: true");
      continue;
    }
    throw CheckpointError(file + ": tensor '" + name + "' is not a parameter of the LLaMA model config.json describes");
  }

  TrainingProgress progress;
  progress.step = 0;
  progress.train_seed = config.train.seed;
  progress.data_seed = config.data.seed;
  const std::optional<TokenizerFiles> tokenizer = read_hf_tokenizer(hf_dir, config.model.vocab_size);
  const std::string path =
      save_weights_checkpoint(checkpoint_dir, *model, progress, config.yaml, tokenizer ? &*tokenizer : nullptr);
  // A training config for the imported model, beside its checkpoint: every key, the
  // model's from config.json; data.path (a stand-in) and train.init_from are the user's to set.
  write_text((fs::path(checkpoint_dir) / "train-config.yaml").string(),
             "# Written by trainer import-hf from " + config_json + ".\n# Train with: trainer train " +
                 (fs::path(checkpoint_dir) / "train-config.yaml").string() + " --set data.path=DATA --set train.init_from=" +
                 path + "\n" + config.yaml);
  spdlog::info("import-hf: {} ({} layers, hidden {}, vocabulary {}, {:.1f} M parameters) -> {}", hf_dir,
               config.model.num_layers, config.model.hidden_size, config.model.vocab_size,
               model->num_parameters() / 1e6, path);
  return path;
}

std::string export_hf(const std::string& checkpoint, const std::string& output_dir, const HfExportOptions& options) {
  if (options.dtype == SafetensorsDtype::F16) throw UsageError("--dtype: export-hf writes bf16 or fp32");
  const std::string path = checkpoint_or_latest(checkpoint);
  const CheckpointContents contents = checkpoint_contents(path);
  const Config config = parse_manifest_config(contents.config, path);
  const ModelConfig& m = config.model;

  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (!fs::is_directory(output_dir, ec)) throw CheckpointError(output_dir + ": cannot create the directory");
  for (const auto& entry : fs::directory_iterator(output_dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || name == kIndexFile || entry.path().extension() == ".safetensors")
      throw UsageError("--output '" + output_dir + "' already holds a model (" + name + "); choose an empty directory");
  }
  // The tokenizer's files and its special ids (checkpoint/hf_tokenizer.h).
  const HfSpecialIds special = export_hf_tokenizer(path, read_manifest(path), m.vocab_size, options.bos_token_id,
                                                   options.eos_token_id, output_dir);

  // Shards: consecutive tensors while they fit in max_shard_bytes (a tensor larger
  // than the limit gets a shard of its own), as transformers' save_pretrained does.
  const size_t value_bytes = safetensors_dtype_bytes(options.dtype);
  std::vector<size_t> shard_of;
  std::vector<uint64_t> shard_bytes;
  uint64_t total = 0;
  for (const CheckpointTensorInfo& t : contents.tensors) {
    uint64_t bytes = value_bytes;
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    if (shard_bytes.empty() || (shard_bytes.back() > 0 && shard_bytes.back() + bytes > options.max_shard_bytes))
      shard_bytes.push_back(0);
    shard_bytes.back() += bytes;
    shard_of.push_back(shard_bytes.size() - 1);
    total += bytes;
  }
  const size_t shards = shard_bytes.size();
  auto shard_name = [&](size_t s) {
    if (shards == 1) return std::string(kSingleFile);
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards);
    return std::string(name);
  };

  // The tensors stream from the checkpoint in order; each shard's writer opens at
  // its first tensor and finishes at its last.
  std::unique_ptr<SafetensorsWriter> writer;
  size_t index = 0;
  read_whole_tensors(path, [&](const CheckpointTensorInfo& t, std::vector<float>&& values) {
    const size_t s = shard_of.at(index);
    if (!writer) {
      std::vector<SafetensorsWriter::Spec> specs;
      for (size_t i = index; i < contents.tensors.size() && shard_of[i] == s; ++i)
        specs.push_back({contents.tensors[i].name, options.dtype, contents.tensors[i].shape});
      writer = std::make_unique<SafetensorsWriter>((fs::path(output_dir) / shard_name(s)).string(), specs,
                                                   std::map<std::string, std::string>{{"format", "pt"}});
    }
    if (t.name != contents.tensors[index].name) throw CheckpointError(path + ": tensor order changed while reading");
    writer->write_floats(values);
    ++index;
    if (index == contents.tensors.size() || shard_of[index] != s) {
      writer->finish();
      writer.reset();
    }
  });
  if (index != contents.tensors.size()) throw CheckpointError(path + ": fewer tensors read than listed");

  if (shards > 1) {
    OrderedJson weight_map = OrderedJson::object();
    for (size_t i = 0; i < contents.tensors.size(); ++i) weight_map[contents.tensors[i].name] = shard_name(shard_of[i]);
    OrderedJson idx = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text((fs::path(output_dir) / kIndexFile).string(), idx.dump(2) + "\n");
  }

  const char* torch_dtype = options.dtype == SafetensorsDtype::BF16 ? "bfloat16" : "float32";
  OrderedJson cfg = hf_config_json(m, config.data.max_seq_len, torch_dtype);
  cfg["bos_token_id"] = special.bos;
  cfg["eos_token_id"] = special.eos;
  write_text((fs::path(output_dir) / "config.json").string(), cfg.dump(2) + "\n");
  OrderedJson gen = {{"_from_model_config", true}, {"bos_token_id", special.bos}, {"eos_token_id", special.eos}};
  write_text((fs::path(output_dir) / "generation_config.json").string(), gen.dump(2) + "\n");
  spdlog::info("export-hf: {} (step {}) -> {}: {} tensors, {} in {} file{}, {:.1f} MB", path,
               contents.progress.step, output_dir, contents.tensors.size(), torch_dtype, shards, shards == 1 ? "" : "s",
               total / 1e6);
  return path;
}

}  // namespace hdp
