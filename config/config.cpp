// Strict YAML configuration: a schema table (section -> key -> typed field)
// drives parsing, --set overrides, re-emission and the error messages.
// Every error is one line: "<where>: <key.path>: <problem>; <what is valid>".

#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <system_error>
#include <variant>

#include "base/yaml_reader.h"
#include "parallel/nccl_communicator.h"

namespace hdp {
namespace {

// ---------------------------------------------------------------------------
// Schema

// A key whose values are the names of an enum's values (scheduler.policy: naive).
// A name the table lacks is refused with "unknown <noun> '<name>'; <valid>".
struct EnumRef {
  std::function<std::string()> name;
  std::function<bool(const std::string&)> set_name;  // false: not a name of the enum
  const char* noun;
  std::string valid;  // "choose " and the table's choices
};

// std::optional<int64_t>: a whole number or null (model.sliding_window).
using FieldRef = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<int64_t>*,
                              std::optional<int64_t>*, EnumRef>;

struct Field {
  std::string key;
  std::function<FieldRef(Config&)> ref;
};

struct Section {
  std::string name;
  std::vector<Field> fields;
};

// member: of the section or of a struct it derives from (ParallelConfig's degrees).
template <class S, class M, class T>
Field field(const char* key, S Config::*section, T M::*member) {
  return Field{key, [section, member](Config& c) -> FieldRef { return &((c.*section).*member); }};
}

template <class S, class E, size_t N>
Field enum_field(const char* key, S Config::*section, E S::*member, const EnumName<E> (&names)[N],
                 const char* noun) {
  return Field{key, [section, member, &names, noun](Config& c) -> FieldRef {
                 E* value = &((c.*section).*member);
                 auto name = [value, &names] { return std::string(enum_name(names, *value)); };
                 auto set_name = [value, &names](const std::string& text) {
                   const std::optional<E> parsed = enum_value(names, text);
                   if (parsed) *value = *parsed;
                   return parsed.has_value();
                 };
                 return EnumRef{name, set_name, noun, "choose " + enum_choices(names)};
               }};
}

const std::vector<Section>& schema() {
  static const std::vector<Section> sections = {
      {"model",
       {field("arch", &Config::model, &ModelConfig::arch),
        field("vocab_size", &Config::model, &ModelConfig::vocab_size),
        field("hidden_size", &Config::model, &ModelConfig::hidden_size),
        field("num_layers", &Config::model, &ModelConfig::num_layers),
        field("num_heads", &Config::model, &ModelConfig::num_heads),
        field("num_kv_heads", &Config::model, &ModelConfig::num_kv_heads),
        field("ffn_hidden_size", &Config::model, &ModelConfig::ffn_hidden_size),
        field("rope_theta", &Config::model, &ModelConfig::rope_theta),
        field("norm_eps", &Config::model, &ModelConfig::norm_eps),
        field("tie_embeddings", &Config::model, &ModelConfig::tie_embeddings),
        field("init_std", &Config::model, &ModelConfig::init_std),
        field("sliding_window", &Config::model, &ModelConfig::sliding_window),
        field("num_experts", &Config::model, &ModelConfig::num_experts),
        field("experts_per_token", &Config::model, &ModelConfig::experts_per_token),
        field("router_aux_loss_coef", &Config::model, &ModelConfig::router_aux_loss_coef)}},
      {"data",
       {field("path", &Config::data, &DataConfig::path),
        field("format", &Config::data, &DataConfig::format),
        field("max_seq_len", &Config::data, &DataConfig::max_seq_len),
        field("global_batch_tokens", &Config::data, &DataConfig::global_batch_tokens),
        field("micro_batch_tokens", &Config::data, &DataConfig::micro_batch_tokens),
        field("shuffle", &Config::data, &DataConfig::shuffle),
        field("seed", &Config::data, &DataConfig::seed)}},
      {"optim",
       {field("lr", &Config::optim, &OptimConfig::lr),
        field("min_lr", &Config::optim, &OptimConfig::min_lr),
        field("warmup_steps", &Config::optim, &OptimConfig::warmup_steps),
        field("weight_decay", &Config::optim, &OptimConfig::weight_decay),
        field("beta1", &Config::optim, &OptimConfig::beta1),
        field("beta2", &Config::optim, &OptimConfig::beta2),
        field("eps", &Config::optim, &OptimConfig::eps),
        field("grad_clip", &Config::optim, &OptimConfig::grad_clip)}},
      {"train",
       {field("steps", &Config::train, &TrainConfig::steps),
        field("seed", &Config::train, &TrainConfig::seed),
        field("log_every", &Config::train, &TrainConfig::log_every),
        field("run_dir", &Config::train, &TrainConfig::run_dir),
        field("checkpoint_every", &Config::train, &TrainConfig::checkpoint_every),
        field("checkpoint_dir", &Config::train, &TrainConfig::checkpoint_dir),
        field("keep_checkpoints", &Config::train, &TrainConfig::keep_checkpoints),
        field("async_checkpoints", &Config::train, &TrainConfig::async_checkpoints),
        field("reuse_checkpoint_dir", &Config::train, &TrainConfig::reuse_checkpoint_dir),
        enum_field("resume", &Config::train, &TrainConfig::resume, kResumeModeNames, "mode"),
        field("init_from", &Config::train, &TrainConfig::init_from),
        field("peak_flops", &Config::train, &TrainConfig::peak_flops),
        field("threads", &Config::train, &TrainConfig::threads),
        enum_field("device", &Config::train, &TrainConfig::device, kDeviceNames, "device"),
        field("tf32", &Config::train, &TrainConfig::tf32),
        enum_field("precision", &Config::train, &TrainConfig::precision, kPrecisionNames, "precision"),
        field("spike_factor", &Config::train, &TrainConfig::spike_factor),
        field("max_bad_steps", &Config::train, &TrainConfig::max_bad_steps),
        field("hang_timeout_s", &Config::train, &TrainConfig::hang_timeout_s)}},
      {"parallel",
       {field("tp", &Config::parallel, &ParallelConfig::tp),
        field("pp", &Config::parallel, &ParallelConfig::pp),
        field("hdp", &Config::parallel, &ParallelConfig::hdp),
        field("ep", &Config::parallel, &ParallelConfig::ep),
        field("pp_layers", &Config::parallel, &ParallelConfig::pp_layers),
        field("bucket_mb", &Config::parallel, &ParallelConfig::bucket_mb),
        enum_field("comm", &Config::parallel, &ParallelConfig::comm, kCommModeNames, "communicator")}},
      {"scheduler",
       {enum_field("policy", &Config::scheduler, &SchedulerConfig::policy, kSchedulerPolicyNames, "policy"),
        enum_field("balance", &Config::scheduler, &SchedulerConfig::balance, kSchedulerBalanceNames, "balance mode"),
        field("threshold", &Config::scheduler, &SchedulerConfig::threshold),
        field("cp", &Config::scheduler, &SchedulerConfig::cp),
        field("cost_file", &Config::scheduler, &SchedulerConfig::cost_file)}},
      {"offload",
       {field("enabled", &Config::offload, &OffloadConfig::enabled),
        field("ratio", &Config::offload, &OffloadConfig::ratio),
        field("bandwidth_gbs", &Config::offload, &OffloadConfig::bandwidth_gbs)}},
      {"loader",
       {enum_field("mode", &Config::loader, &LoaderConfig::mode, kLoaderModeNames, "mode"),
        field("servers", &Config::loader, &LoaderConfig::servers),
        field("timeout_s", &Config::loader, &LoaderConfig::timeout_s)}},
      {"trace",
       {field("every", &Config::trace, &TraceConfig::every),
        field("steps", &Config::trace, &TraceConfig::steps),
        field("dir", &Config::trace, &TraceConfig::dir)}},
  };
  return sections;
}

const Section* find_section(const std::string& name) {
  for (const Section& s : schema())
    if (s.name == name) return &s;
  return nullptr;
}

const Field* find_field(const Section& section, const std::string& key) {
  for (const Field& f : section.fields)
    if (f.key == key) return &f;
  return nullptr;
}

// ---------------------------------------------------------------------------
// Messages

std::vector<std::string> section_names() {
  std::vector<std::string> names;
  for (const Section& s : schema()) names.push_back(s.name);
  return names;
}

std::vector<std::string> key_names(const Section& section) {
  std::vector<std::string> names;
  for (const Field& f : section.fields) names.push_back(f.key);
  return names;
}

// A section name that is really a key of some section ("lr" -> "optim.lr").
std::string misplaced_key_hint(const std::string& name) {
  for (const Section& s : schema())
    if (find_field(s, name)) return "keys go inside their section: did you mean '" + s.name + "." + name + "'? ";
  return "";
}

[[noreturn]] void unknown_section(const std::string& where, const std::string& name) {
  std::string hint = misplaced_key_hint(name);
  if (hint.empty()) hint = did_you_mean(name, section_names());
  throw_config_error(where, name, "unknown section", hint + "valid sections: " + join_names(section_names()));
}

[[noreturn]] void unknown_key(const std::string& where, const Section& section, const std::string& key) {
  throw_config_error(where, section.name + "." + key, "unknown key in section '" + section.name + "'",
                     did_you_mean(key, key_names(section)) + "valid keys in " + section.name + ": " +
                         join_names(key_names(section)));
}

// A double as a YAML float that YAML 1.1 readers also see as a float: always
// with a dot ("10000.0", "1.0e-08"), still reading back exactly.
std::string yaml_double(double v) {
  std::string text = format_double(v);
  const size_t e = text.find('e');
  const std::string mantissa = text.substr(0, e);
  if (mantissa.find('.') == std::string::npos) text.insert(mantissa.size(), ".0");
  return text;
}

std::string int_list(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// std::visit with one lambda per alternative.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

std::string value_text(const FieldRef& ref) {
  return std::visit(Overloaded{[](const EnumRef& e) { return "'" + e.name() + "'"; },
                               [](auto* p) -> std::string {
                                 using T = std::remove_pointer_t<decltype(p)>;
                                 if constexpr (std::is_same_v<T, std::string>) return "'" + *p + "'";
                                 else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return int_list(*p);
                                 else if constexpr (std::is_same_v<T, std::optional<int64_t>>)
                                   return p->has_value() ? std::to_string(**p) : std::string("null");
                                 else if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
                                 else if constexpr (std::is_same_v<T, double>) return format_double(*p);
                                 else return std::to_string(*p);
                               }},
                    ref);
}

void assign_name(const EnumRef& ref, const YAML::Node& node, const std::string& where, const std::string& key) {
  std::string name = ref.name();
  read_yaml_value(node, where, key, name);
  if (!ref.set_name(name))
    throw_config_error(where, key, "unknown " + std::string(ref.noun) + " '" + name + "'", ref.valid);
}

// Converts `node` into the field's type, or fails naming `where` and `key`.
void assign(const FieldRef& ref, const YAML::Node& node, const std::string& where, const std::string& key) {
  std::visit(Overloaded{[&](const EnumRef& e) { assign_name(e, node, where, key); },
                        [&](std::optional<int64_t>* p) {
                          if (node.IsNull()) {
                            p->reset();
                            return;
                          }
                          int64_t v = p->value_or(0);
                          read_yaml_value(node, where, key, v, p->has_value());
                          *p = v;
                        },
                        [&](auto* p) { read_yaml_value(node, where, key, *p); }},
             ref);
}


// ---------------------------------------------------------------------------
// Parsing

struct Parser {
  std::string source;
  Config config;

  void read_document(const YamlDocument& document) {
    const YAML::Node& root = document.root();
    if (root.IsNull()) return;
    if (!root.IsMap())
      throw_config_error(document.where(root), "(top level)",
                         "expected a mapping of sections, got " + describe_yaml(root),
                         "write sections " + join_names(section_names()) + " at the top level");
    const YamlMap sections(document, root, "", source);
    for (const YamlEntry& entry : sections.entries()) {
      const Section* section = find_section(entry.key);
      if (!section) unknown_section(entry.where, entry.key);
      config.origins[entry.key] = entry.where;
      read_section(document, *section, entry);
    }
  }

  void read_section(const YamlDocument& document, const Section& section, const YamlEntry& header) {
    if (header.value.IsNull()) return;
    if (!header.value.IsMap())
      throw_config_error(header.where, section.name, "expected a mapping of keys, got " + describe_yaml(header.value),
                         "valid keys in " + section.name + ": " + join_names(key_names(section)));
    const YamlMap keys(document, header.value, section.name, header.where);
    for (const YamlEntry& entry : keys.entries()) {
      const Field* f = find_field(section, entry.key);
      if (!f) unknown_key(entry.where, section, entry.key);
      const std::string path = section.name + "." + entry.key;
      assign(f->ref(config), entry.value, entry.where, path);  // at the key's line, also for values on later lines
      config.origins[path] = entry.where;
    }
  }

  void apply_override(const std::string& text) {
    const std::string where = "--set " + text;
    const size_t eq = text.find('=');
    auto trim = [](std::string s) {
      const char* ws = " \t\r\n";
      s.erase(0, s.find_first_not_of(ws));
      const size_t last = s.find_last_not_of(ws);
      s.erase(last == std::string::npos ? 0 : last + 1);
      return s;
    };
    if (eq == std::string::npos)
      throw_config_error(where, "", "malformed override, there is no '='",
           "write --set section.key=value, e.g. --set optim.lr=1e-3");
    const std::string path = trim(text.substr(0, eq));
    const std::string raw_value = text.substr(eq + 1);
    if (path.empty())
      throw_config_error(where, "", "malformed override, the key path before '=' is empty",
           "write --set section.key=value, e.g. --set optim.lr=1e-3");
    const size_t dot = path.find('.');
    const std::string section_name = path.substr(0, dot);
    const Section* section = find_section(section_name);
    if (!section) unknown_section(where, section_name);
    if (dot == std::string::npos)
      throw_config_error(where, path, "an override must name a key inside the section",
           "write --set " + path + ".<key>=value with one of: " + join_names(key_names(*section)));
    const std::string key = path.substr(dot + 1);
    const Field* f = find_field(*section, key);
    if (!f) unknown_key(where, *section, key);
    YAML::Node value;
    try {
      value = YAML::Load(raw_value);
    } catch (const YAML::Exception& e) {
      throw_config_error(where, path, "cannot read the value as YAML (" + e.msg + ")",
           "quote it for the shell, e.g. --set '" + path + "=...'");
    }
    assign(f->ref(config), value, where, path);
    config.origins[path] = where;
  }

  // Where to point for `key`: where it was set, else where one of `related`
  // was set, else its section header, else the top of the file.
  std::string origin(const std::string& key, const std::vector<std::string>& related = {}) const {
    if (auto it = config.origins.find(key); it != config.origins.end()) return it->second;
    for (const std::string& r : related)
      if (auto it = config.origins.find(r); it != config.origins.end()) return it->second;
    const std::string section = key.substr(0, key.find('.'));
    if (auto it = config.origins.find(section); it != config.origins.end()) return it->second;
    return source + ":1";
  }

  // Value of `key` for messages, marked "(default)" when it was not set.
  std::string shown(const std::string& key) {
    const size_t dot = key.find('.');
    const Field* f = find_field(*find_section(key.substr(0, dot)), key.substr(dot + 1));
    std::string text = value_text(f->ref(config));
    if (!config.origins.count(key)) text += " (default)";
    return text;
  }

  void require(bool ok, const std::string& key, const std::string& problem, const std::string& valid,
               const std::vector<std::string>& related = {}) {
    if (!ok) throw_config_error(origin(key, related), key, problem, valid);
  }
  void positive(int64_t v, const std::string& key) {
    require(v > 0, key, shown(key) + " is not positive", "it must be at least 1");
  }
  void positive(double v, const std::string& key) {
    require(v > 0, key, shown(key) + " is not positive", "it must be greater than 0");
  }
  void non_negative(int64_t v, const std::string& key, const std::string& valid = "it must be 0 or more") {
    require(v >= 0, key, shown(key) + " is negative", valid);
  }
  void non_negative(double v, const std::string& key, const std::string& valid = "it must be 0 or more") {
    require(v >= 0, key, shown(key) + " is negative", valid);
  }

  // kind: a regular file, or a directory (checkpoints are directories).
  enum class PathKind { File, Directory };
  void check_path(const std::string& path, const std::string& key, const std::string& hint, PathKind kind) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    std::string cwd;
    {
      std::error_code cwd_ec;
      cwd = fs::current_path(cwd_ec).string();
    }
    const std::string relative =
        fs::path(path).is_relative() ? " (relative to the working directory " + cwd + ")" : "";
    const char* noun = kind == PathKind::File ? "file" : "directory";
    if (!fs::exists(status)) require(false, key, std::string(noun) + " '" + path + "' does not exist" + relative, hint);
    if (kind == PathKind::File && fs::is_directory(status))
      require(false, key, "'" + path + "' is a directory, not a file" + relative, hint);
    if (kind == PathKind::Directory && !fs::is_directory(status))
      require(false, key, "'" + path + "' is not a directory" + relative, hint);
  }

  void validate(bool check_files) {
    const ModelConfig& m = config.model;
    const DataConfig& d = config.data;
    const OptimConfig& o = config.optim;
    const TrainConfig& t = config.train;
    const ParallelConfig& p = config.parallel;

    // model
    require(m.arch == "llama" || m.arch == "mistral" || m.arch == "mixtral", "model.arch",
            "unsupported architecture " + shown("model.arch"), "choose 'llama', 'mistral' or 'mixtral'");
    // As Hugging Face configs: MistralConfig and MixtralConfig carry sliding_window (4096
    // in Mistral 7B v0.1, null from v0.2 on), LlamaConfig has none, so a window on llama
    // is a mistake.
    if (m.sliding_window) {
      require(m.arch != "llama", "model.sliding_window",
              "a sliding window needs model.arch 'mistral' or 'mixtral', not " + shown("model.arch"),
              "set model.arch: mistral, or remove model.sliding_window (or set it to null) for full attention",
              {"model.arch"});
      require(*m.sliding_window >= 1, "model.sliding_window", shown("model.sliding_window") + " is not positive",
              "it must be at least 1 (keys a query sees, itself included), or null for full attention");
      require(*m.sliding_window <= std::numeric_limits<int32_t>::max(), "model.sliding_window",
              shown("model.sliding_window") + " is too large",
              "positions are 32-bit; use null for full attention");
    }
    positive(m.vocab_size, "model.vocab_size");
    positive(m.hidden_size, "model.hidden_size");
    positive(m.num_layers, "model.num_layers");
    positive(m.num_heads, "model.num_heads");
    require(m.hidden_size % m.num_heads == 0, "model.num_heads",
            shown("model.num_heads") + " does not divide model.hidden_size " + shown("model.hidden_size"),
            "choose a divisor of " + std::to_string(m.hidden_size), {"model.hidden_size"});
    positive(m.num_kv_heads, "model.num_kv_heads");
    require(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
            shown("model.num_kv_heads") + " does not divide model.num_heads " + shown("model.num_heads"),
            "choose a divisor of " + std::to_string(m.num_heads) + " (grouped-query attention shares each KV head among num_heads/num_kv_heads query heads)",
            {"model.num_heads"});
    require(m.head_dim() % 2 == 0, "model.num_heads",
            "head dimension model.hidden_size/model.num_heads = " + std::to_string(m.hidden_size) + "/" +
                std::to_string(m.num_heads) + " = " + std::to_string(m.head_dim()) + " is odd",
            "RoPE rotates pairs of dimensions, so choose hidden_size and num_heads with an even quotient",
            {"model.hidden_size"});
    positive(m.ffn_hidden_size, "model.ffn_hidden_size");
    positive(m.rope_theta, "model.rope_theta");
    positive(m.norm_eps, "model.norm_eps");
    positive(m.init_std, "model.init_std");

    // data
    require(!d.path.empty(), "data.path", "required key is missing",
            "set it to an HDF5 token dataset, e.g. data.path: data-cache/demo-corpus.h5 (make one with "
            "'trainer make-corpus --output <path>' or 'trainer prepare-data')");
    require(d.format == "hdf5" || d.format == "megatron", "data.format", "unsupported dataset format " + shown("data.format"),
            "choose hdf5 (this trainer's file) or megatron (Megatron-LM's PREFIX.bin + PREFIX.idx, data.path = PREFIX; "
            "docs/dataset-format.md)");
    require(d.max_seq_len >= 2, "data.max_seq_len", shown("data.max_seq_len") + " is too small",
            "it must be at least 2 (a sequence needs an input and a next-token target)");
    positive(d.micro_batch_tokens, "data.micro_batch_tokens");
    require(d.global_batch_tokens >= d.max_seq_len, "data.global_batch_tokens",
            shown("data.global_batch_tokens") + " is smaller than data.max_seq_len " + shown("data.max_seq_len"),
            "a batch must hold at least one full sequence, so choose global_batch_tokens >= " +
                std::to_string(d.max_seq_len) + " or lower data.max_seq_len",
            {"data.max_seq_len"});

    // optim
    positive(o.lr, "optim.lr");
    non_negative(o.min_lr, "optim.min_lr", "choose 0 <= min_lr <= optim.lr");
    require(o.min_lr <= o.lr, "optim.min_lr",
            shown("optim.min_lr") + " is larger than optim.lr " + shown("optim.lr"),
            "choose 0 <= min_lr <= " + format_double(o.lr) + " (the schedule decays from lr to min_lr)",
            {"optim.lr"});
    non_negative(o.warmup_steps, "optim.warmup_steps");
    non_negative(o.weight_decay, "optim.weight_decay");
    require(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1", shown("optim.beta1") + " is outside [0, 1)",
            "choose 0 <= beta1 < 1, e.g. 0.9");
    require(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2", shown("optim.beta2") + " is outside [0, 1)",
            "choose 0 <= beta2 < 1, e.g. 0.95");
    positive(o.eps, "optim.eps");
    non_negative(o.grad_clip, "optim.grad_clip", "it must be 0 or more (0 disables clipping)");

    // train
    positive(t.steps, "train.steps");
    positive(t.log_every, "train.log_every");
    require(!t.run_dir.empty(), "train.run_dir", "is empty", "name a directory, e.g. runs/my-run");
    non_negative(t.checkpoint_every, "train.checkpoint_every", "it must be 0 or more (0 disables checkpoints)");
    require(!t.checkpoint_dir.empty(), "train.checkpoint_dir", "is empty",
            "name a directory, e.g. runs/my-run/checkpoints");
    require(t.keep_checkpoints >= 1, "train.keep_checkpoints", shown("train.keep_checkpoints") + " is less than 1",
            "keep at least 1 checkpoint");
    non_negative(t.threads, "train.threads", "it must be 0 or more (0 = cores / ranks on the node)");
    non_negative(t.peak_flops, "train.peak_flops", "it must be 0 or more (0 = measure with a GEMM probe)");
    require(t.spike_factor == 0 || t.spike_factor > 1, "train.spike_factor",
            shown("train.spike_factor") + " is not 0 or above 1",
            "choose 0 (no spike detection) or a factor above 1, e.g. 3: a step whose loss exceeds it times the median "
            "of the recent good steps is skipped");
    require(t.max_bad_steps >= 1, "train.max_bad_steps", shown("train.max_bad_steps") + " is less than 1",
            "choose how many skipped steps in a row stop the run, at least 1 (1 = stop at the first bad step)");
    require(t.hang_timeout_s == 0 || (t.hang_timeout_s >= 1 && std::isfinite(t.hang_timeout_s)), "train.hang_timeout_s",
            shown("train.hang_timeout_s") + " is not 0 or at least 1",
            "choose the seconds without progress after which the job is declared hung, at least 1 (default 600), or 0 "
            "to turn hang detection off");

    // trace
    non_negative(config.trace.every, "trace.every", "it must be 0 or more (0 = no tracing)");
    require(config.trace.steps >= 1 && (config.trace.every == 0 || config.trace.steps <= config.trace.every),
            "trace.steps", shown("trace.steps") + " is not between 1 and trace.every",
            "trace this many consecutive steps out of every trace.every steps");

    // parallel
    positive(int64_t{p.tp}, "parallel.tp");
    positive(int64_t{p.pp}, "parallel.pp");
    positive(int64_t{p.hdp}, "parallel.hdp");
    positive(int64_t{p.ep}, "parallel.ep");
    // Expert parallelism subdivides hdp (spec/parallel_degrees.h) and shares out
    // whole experts.
    require(p.ep == 1 || m.moe(), "parallel.ep", shown("parallel.ep") + " with model.arch " + shown("model.arch"),
            "expert parallelism spreads a mixture of experts; use model.arch: mixtral or parallel.ep: 1",
            {"model.arch"});
    require(p.hdp % p.ep == 0, "parallel.ep",
            shown("parallel.ep") + " does not divide parallel.hdp " + shown("parallel.hdp"),
            "an expert-parallel group is ep of the hdp ranks; choose a divisor of " + std::to_string(p.hdp),
            {"parallel.hdp"});
    require(!m.moe() || m.num_experts % p.ep == 0, "parallel.ep",
            shown("parallel.ep") + " does not divide model.num_experts " + shown("model.num_experts"),
            "every rank of an expert-parallel group holds num_experts / ep whole experts; choose a divisor of " +
                std::to_string(m.num_experts),
            {"model.num_experts"});
    positive(p.bucket_mb, "parallel.bucket_mb");
    if (p.comm == CommMode::Nccl) {
      require(t.device == Device::CUDA, "parallel.comm",
              shown("parallel.comm") + " needs train.device: cuda, not " + shown("train.device"),
              "NCCL moves GPU buffers; use parallel.comm: mpi (or auto) on the CPU", {"train.device"});
      // Whether this build has NCCL is a property of the machine, like the files:
      // not checked for a config read back from a checkpoint elsewhere.
      require(!check_files || nccl_compiled(), "parallel.comm",
              shown("parallel.comm") + " asked for, but this build has no NCCL (it needs the CUDA backend and libnccl)",
              "use parallel.comm: mpi or auto, or rebuild with CUDA and NCCL");
    }
    require(m.num_kv_heads % p.tp == 0, "parallel.tp",
            shown("parallel.tp") + " does not divide model.num_kv_heads " + shown("model.num_kv_heads"),
            "tensor parallelism splits the key/value heads across ranks; choose a divisor of " +
                std::to_string(m.num_kv_heads),
            {"model.num_kv_heads"});
    require(m.ffn_hidden_size % p.tp == 0, "parallel.tp",
            shown("parallel.tp") + " does not divide model.ffn_hidden_size " + shown("model.ffn_hidden_size"),
            "tensor parallelism splits the MLP columns across ranks; choose a divisor of " +
                std::to_string(m.ffn_hidden_size),
            {"model.ffn_hidden_size"});
    require(m.vocab_size >= p.tp, "parallel.tp", shown("parallel.tp") + " exceeds model.vocab_size",
            "every tensor-parallel rank needs a slice of the vocabulary", {"model.vocab_size"});
    require(m.num_layers >= p.pp, "parallel.pp",
            shown("parallel.pp") + " is more than model.num_layers " + shown("model.num_layers"),
            "every pipeline stage needs at least one layer; choose pp <= " + std::to_string(m.num_layers),
            {"model.num_layers"});
    if (!p.pp_layers.empty()) {
      int64_t total = 0;
      bool positive_counts = true;
      for (int64_t n : p.pp_layers) {
        total += n;
        positive_counts = positive_counts && n >= 1;
      }
      require(static_cast<int64_t>(p.pp_layers.size()) == p.pp && positive_counts && total == m.num_layers,
              "parallel.pp_layers",
              shown("parallel.pp_layers") + " does not give each of the " + std::to_string(p.pp) +
                  " stages at least one layer of the model's " + std::to_string(m.num_layers),
              "list pp layer counts of at least 1 that sum to model.num_layers, or leave it empty for a "
              "cost-balanced split",
              {"parallel.pp", "model.num_layers"});
    }

    // scheduler and offload
    const SchedulerConfig& sc = config.scheduler;
    const OffloadConfig& of = config.offload;
    require(sc.threshold >= 0 && sc.threshold < 1, "scheduler.threshold", shown("scheduler.threshold") + " is outside [0, 1)",
            "choose the fraction of the busiest rank's time below which a rank receives more work, e.g. 0.05");
    non_negative(sc.cp, "scheduler.cp", "it must be 0 (automatic) or a divisor of parallel.hdp");
    require(sc.cp == 0 || p.hdp % sc.cp == 0, "scheduler.cp",
            shown("scheduler.cp") + " does not divide parallel.hdp " + shown("parallel.hdp"),
            "the static grid is dp x cp = hdp; choose a divisor of " + std::to_string(p.hdp) + " or 0", {"parallel.hdp"});
    require(sc.policy != SchedulerPolicy::Static || d.max_seq_len <= p.hdp * d.micro_batch_tokens, "data.max_seq_len",
            shown("data.max_seq_len") + " does not fit the static grid: at most parallel.hdp x data.micro_batch_tokens = " +
                std::to_string(p.hdp * d.micro_batch_tokens) + " tokens",
            "lower data.max_seq_len, or raise parallel.hdp or data.micro_batch_tokens", {"parallel.hdp", "scheduler.policy"});
    require(of.ratio <= 1, "offload.ratio", shown("offload.ratio") + " is above 1",
            "choose a fraction in [0, 1], or a negative value to let the cost model choose");
    positive(of.bandwidth_gbs, "offload.bandwidth_gbs");

    // loader
    const LoaderConfig& lo = config.loader;
    positive(lo.servers, "loader.servers");
    positive(lo.timeout_s, "loader.timeout_s");

    // Mixtral (Jiang et al. 2024): on every device and precision, under tp (sharded
    // experts), pp, hdp (rings and offload too) and ep (model/moe.h). Its keys are read
    // but unused for other architectures (the effective config writes every key, so they
    // cannot be refused there).
    if (m.moe()) {
      positive(m.num_experts, "model.num_experts");
      require(m.experts_per_token >= 1 && m.experts_per_token <= m.num_experts, "model.experts_per_token",
              shown("model.experts_per_token") + " is outside [1, model.num_experts = " +
                  std::to_string(m.num_experts) + "]",
              "choose how many experts each token runs, e.g. 2 as Mixtral", {"model.num_experts"});
      non_negative(m.router_aux_loss_coef, "model.router_aux_loss_coef",
                   "it must be 0 or more (Mixtral uses 0.02, Hugging Face defaults to 0.001)");
      // A forward's (token, choice) counts are kept as fp32, the form in which they
      // travel between pipeline stages and ring members (model/model.h, routing_input):
      // exact below 2^24. A forward is one micro-batch, or with sequences longer than a
      // micro-batch a ring of at most hdp members, each holding at most the longest
      // sequence (offload lets a member hold more than the capacity). The product is
      // taken in double: the sizes are not checked yet (below).
      const bool rings = d.max_seq_len > d.micro_batch_tokens;
      const double forward_tokens = rings ? static_cast<double>(p.hdp) * static_cast<double>(d.max_seq_len)
                                          : static_cast<double>(d.micro_batch_tokens);
      require(static_cast<double>(m.num_layers) * forward_tokens * static_cast<double>(m.experts_per_token) <
                  static_cast<double>(int64_t{1} << 24),
              "data.micro_batch_tokens",
              (rings ? "parallel.hdp " + shown("parallel.hdp") + " x data.max_seq_len " + shown("data.max_seq_len")
                     : shown("data.micro_batch_tokens")) +
                  " x model.num_layers x model.experts_per_token reaches 2^24 with model.arch 'mixtral'",
              "the routing counts of a forward are exact below 2^24; use smaller micro-batches or sequences",
              rings ? std::vector<std::string>{"data.max_seq_len", "parallel.hdp", "model.num_layers",
                                               "model.experts_per_token"}
                    : std::vector<std::string>{"model.num_layers", "model.experts_per_token"});
    }

    // Sizes are 64-bit: element counts and offsets are int64 (the model lays every
    // parameter out in one flat buffer), byte counts size_t. A shape whose counts
    // do not fit would wrap around and fail later with a meaningless bounds error,
    // so the counts are made in double (exact enough to compare with 2^63) and must
    // fit with room: the fp32 weights, their gradients and the two AdamW moments, 16
    // bytes a parameter, and one micro-batch's logits (micro_batch_tokens x vocab).
    {
      const ModelShape shape = m.shape();
      const double parameters = static_cast<double>(m.num_layers) * layer_parameters(shape) +
                                embedding_parameters(shape) + head_parameters(shape, 1);
      const double state_bytes = 16 * parameters;
      const double logits = static_cast<double>(d.micro_batch_tokens) * static_cast<double>(m.vocab_size);
      constexpr double kLimit = 0x1p62;  // bytes or elements: a quarter of what int64 counts
      if (state_bytes >= kLimit || logits >= kLimit) {
        // Named first: the largest of the sizes, the likeliest typo.
        std::vector<std::string> keys = {"model.hidden_size", "model.ffn_hidden_size", "model.vocab_size",
                                         "model.num_layers"};
        if (m.moe()) keys.push_back("model.num_experts");
        if (logits >= kLimit) keys.push_back("data.micro_batch_tokens");
        auto value = [&](const std::string& key) {
          return key == "model.hidden_size" ? m.hidden_size : key == "model.ffn_hidden_size" ? m.ffn_hidden_size
               : key == "model.vocab_size" ? m.vocab_size : key == "model.num_layers" ? m.num_layers
               : key == "model.num_experts" ? m.num_experts : d.micro_batch_tokens;
        };
        std::stable_sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) { return value(a) > value(b); });
        std::string sizes;
        for (const std::string& key : keys) sizes += (sizes.empty() ? "" : ", ") + key + " " + std::to_string(value(key));
        char need[160];
        if (state_bytes >= kLimit) {
          std::snprintf(need, sizeof(need), "%.3g parameters, whose weights, gradients and AdamW moments need %.3g bytes",
                        parameters, state_bytes);
        } else {
          std::snprintf(need, sizeof(need), "%.3g logits a micro-batch, %.3g bytes", logits, 4 * logits);
        }
        require(false, keys.front(),
                "too large to count: " + sizes + " make " + need +
                    ", beyond 64-bit sizes (2^62 = 4.6e18)",
                "check these sizes for a typo; the largest models trained today have about 1e12 parameters", keys);
      }
    }

    // files last, so that value errors are reported even before the data exists
    if (check_files) {
      if (d.format == "megatron") {
        for (const char* ext : {".bin", ".idx"})
          check_path(d.path + ext, "data.path",
                     "with data.format megatron, data.path is the PREFIX of PREFIX.bin and PREFIX.idx (write them "
                     "with 'trainer prepare-data --output-format megatron')",
                     PathKind::File);
      } else {
        check_path(d.path, "data.path",
                   "point data.path at an HDF5 token dataset, or create this one with 'trainer make-corpus "
                   "--output " + d.path + "' (synthetic demo corpus) or 'trainer prepare-data' (from text)",
                   PathKind::File);
      }
      if (!sc.cost_file.empty() && sc.cost_file != "profile")
        check_path(sc.cost_file, "scheduler.cost_file",
                   "point it at a cost file written by 'trainer profile', leave it empty for a model derived from "
                   "FLOPs, or write profile to measure at start-up",
                   PathKind::File);
      if (!t.init_from.empty())
        check_path(t.init_from, "train.init_from",
                   "point it at a checkpoint directory written by the trainer (CHECKPOINT_DIR/step-NNNNNNNN), "
                   "or leave it empty to start from random weights",
                   PathKind::Directory);
    }
  }
};

}  // namespace

std::string emit_config_yaml(const Config& config) {
  Config& c = const_cast<Config&>(config);  // FieldRef is non-const; nothing is written
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const Section& section : schema()) {
    out << YAML::Key << section.name << YAML::Value << YAML::BeginMap;
    for (const Field& f : section.fields) {
      out << YAML::Key << f.key << YAML::Value;
      std::visit(Overloaded{[&](const EnumRef& e) { out << YAML::DoubleQuoted << e.name(); },
                            [&](auto* p) {
                              using T = std::remove_pointer_t<decltype(p)>;
                              if constexpr (std::is_same_v<T, std::string>) out << YAML::DoubleQuoted << *p;
                              else if constexpr (std::is_same_v<T, std::vector<int64_t>>) out << YAML::Flow << *p;
                              else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
                                if (p->has_value()) out << **p;
                                else out << YAML::Null;
                              }
                              else if constexpr (std::is_same_v<T, double>) out << yaml_double(*p);
                              else out << *p;
                            }},
                 f.ref(c));
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {

Config read_config(const YamlDocument& document, const std::vector<std::string>& overrides, bool check_files) {
  Parser parser;
  parser.source = document.source();
  parser.read_document(document);
  for (const std::string& o : overrides) parser.apply_override(o);
  parser.validate(check_files);
  parser.config.source = document.source();
  parser.config.yaml = emit_config_yaml(parser.config);
  return parser.config;
}

}  // namespace

Config parse_config_text(const std::string& yaml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides, bool check_files) {
  return read_config(YamlDocument::parse(yaml_text, source_name), overrides, check_files);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, bool check_files) {
  return read_config(
      YamlDocument::read_file(path, "config", "pass an existing YAML file, e.g. configs/tiny-llama.yaml"), overrides,
      check_files);
}

void validate_dataset_vocab(const Config& config, int64_t dataset_vocab_size, uint32_t dataset_max_token_id) {
  // The dataset's whole vocabulary must fit, not only the ids it happens to hold:
  // a tokenizer larger than the embedding means the data was made for another model.
  if (dataset_vocab_size <= config.model.vocab_size && static_cast<int64_t>(dataset_max_token_id) < config.model.vocab_size)
    return;
  std::string where = (config.source.empty() ? "(config)" : config.source) + ":1";
  if (auto it = config.origins.find("model.vocab_size"); it != config.origins.end()) where = it->second;
  else if (auto it = config.origins.find("model"); it != config.origins.end()) where = it->second;
  const int64_t needed = std::max(static_cast<int64_t>(dataset_max_token_id) + 1, dataset_vocab_size);
  const std::string valid = "set model.vocab_size to at least " + std::to_string(needed) +
                            " (the dataset's vocabulary), or point data.path at a dataset made for this model";
  throw_config_error(where, "model.vocab_size",
       std::to_string(config.model.vocab_size) + " is too small for data.path '" + config.data.path +
           "', whose tokenizer's vocabulary has " + std::to_string(dataset_vocab_size) +
           " entries (largest token id in it " + std::to_string(dataset_max_token_id) + ")",
       valid);
}

void check_output_directories(const Config& config, int rank) {
  namespace fs = std::filesystem;
  auto check = [&](const std::string& key, const std::string& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::string problem;
    if (ec) {
      problem = "cannot create the directory '" + dir + "' (" + ec.message() + ")";
    } else {
      // Only writing shows it: permissions, read-only mounts and quotas all say no here.
      const fs::path probe = fs::path(dir) / (".write-check-rank-" + std::to_string(rank));
      errno = 0;
      const bool written = static_cast<bool>(std::ofstream(probe) << "ok\n");
      if (!written) problem = "cannot write in the directory '" + dir + "' (" + std::strerror(errno) + ")";
      fs::remove(probe, ec);
    }
    if (problem.empty()) return;
    std::string where = (config.source.empty() ? "(config)" : config.source) + ":1";
    if (auto it = config.origins.find(key); it != config.origins.end()) where = it->second;
    else if (auto it = config.origins.find("train"); it != config.origins.end()) where = it->second;
    throw_config_error(where, key, problem + " on rank " + std::to_string(rank),
                       "point it at a directory this user can create and write, or fix its permissions");
  };
  if (rank == 0) check("train.run_dir", config.train.run_dir);
  if (config.train.checkpoint_every > 0) check("train.checkpoint_dir", config.train.checkpoint_dir);
}

}  // namespace hdp
