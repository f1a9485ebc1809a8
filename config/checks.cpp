#include "config/checks.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <system_error>

#include "base/yaml_reader.h"
#include "config/checker.h"
#include "config/model_file.h"
#include "config/pipeline_layers.h"
#include "config/schema.h"
#include "parallel/nccl_communicator.h"
#include "spec/model_checks.h"

namespace hdp {
namespace {

// Each key's own rule (its schema entry), in schema order.
void check_key_rules(const Checker& c) {
  for (const Section& section : config_schema()) {
    for (const Field& f : section.fields) {
      const KeyRule& rule = f.rule;
      const FieldRef ref = f.ref(const_cast<Config&>(c.config));  // read only
      if (!rule.holds || rule.holds(ref)) continue;
      const std::string key = section.name + "." + f.key;
      std::string problem = rule.problem;
      if (const size_t at = problem.find("{value}"); at != std::string::npos)
        problem.replace(at, 7, c.shown(key));
      c.require(false, key, problem, rule.valid);
    }
  }
}

// ---------------------------------------------------------------------------
// Rules between keys

// data.global_batch_tokens x data.max_seq_len
void check_batch_holds_a_sequence(const Checker& c) {
  const DataConfig& d = c.config.data;
  c.require(d.global_batch_tokens >= d.max_seq_len, "data.global_batch_tokens",
            c.shown("data.global_batch_tokens") + " is smaller than data.max_seq_len " + c.shown("data.max_seq_len"),
            "a batch must hold at least one full sequence, so choose global_batch_tokens >= " +
                std::to_string(d.max_seq_len) + " or lower data.max_seq_len",
            {"data.max_seq_len"});
}

// optim.min_lr x optim.lr
void check_learning_rates(const Checker& c) {
  const OptimConfig& o = c.config.optim;
  c.require(o.min_lr <= o.lr, "optim.min_lr", c.shown("optim.min_lr") + " is larger than optim.lr " + c.shown("optim.lr"),
            "choose 0 <= min_lr <= " + format_double(o.lr) + " (the schedule decays from lr to min_lr)",
            {"optim.lr"});
}

// trace.steps x trace.every
void check_trace_window(const Checker& c) {
  const TraceConfig& t = c.config.trace;
  c.require(t.steps >= 1 && (t.every == 0 || t.steps <= t.every), "trace.steps",
            c.shown("trace.steps") + " is not between 1 and trace.every",
            "trace this many consecutive steps out of every trace.every steps");
}

// model x parallel.tp, pp, hdp, ep: the one layout rule of spec/model_checks.h.
void check_layout(const Checker& c) {
  c.require(layout_issue(c.config.model.shape(), c.config.parallel, c.wording()));
}

// What may_offload says, in the keys' words: " with offload.enabled true and
// sequences longer than a micro-batch (...)".
std::string offloaded_long_sequences(const Checker& c) {
  return " with offload.enabled " + c.shown("offload.enabled") +
         " and sequences longer than a micro-batch (data.max_seq_len " + c.shown("data.max_seq_len") +
         " > data.micro_batch_tokens " + c.shown("data.micro_batch_tokens") + ")";
}

// parallel.vpp x model.arch, offload and parallel.pp_layers: interleaved 1F1B
// (model chunks per stage) runs dense models without offload (the planners budget
// offload for a stage's layers as one range, and Mixtral's routing statistics pool
// in the last stage's one pass; LlamaModel), over the cost-balanced split of the
// pp x vpp virtual stages (pp_layers counts stages).
void check_interleaving(const Checker& c) {
  const Config& config = c.config;
  if (config.parallel.vpp == 1) return;
  c.require(!config.model.moe(), "parallel.vpp",
            c.shown("parallel.vpp") + " with model.arch " + c.shown("model.arch") +
                ": the trainer interleaves dense models only",
            "set parallel.vpp: 1", {"model.arch"});
  c.require(!may_offload(config), "parallel.vpp",
            c.shown("parallel.vpp") + offloaded_long_sequences(c) +
                ": the trainer does not offload the activations of model chunks",
            "set offload.enabled: false (long sequences then span hdp ranks in rings), or parallel.vpp: 1",
            {"offload.enabled", "data.max_seq_len", "data.micro_batch_tokens"});
  c.require(config.parallel.pp_layers.empty(), "parallel.vpp",
            c.shown("parallel.vpp") + " with parallel.pp_layers " + c.shown("parallel.pp_layers") +
                ": pp_layers gives one count per stage, not per model chunk",
            "leave parallel.pp_layers empty (the virtual stages are then cost-balanced), or set parallel.vpp: 1",
            {"parallel.pp_layers"});
}

// parallel.pp_layers x parallel.pp x model.num_layers
void check_pipeline_split(const Checker& c) {
  const ParallelConfig& p = c.config.parallel;
  if (p.pp_layers.empty()) return;
  const int64_t layers = c.config.model.num_layers;
  int64_t total = 0;
  bool positive_counts = true;
  for (int64_t n : p.pp_layers) {
    total += n;
    positive_counts = positive_counts && n >= 1;
  }
  c.require(static_cast<int64_t>(p.pp_layers.size()) == p.pp && positive_counts && total == layers,
            "parallel.pp_layers",
            c.shown("parallel.pp_layers") + " does not give each of the " + std::to_string(p.pp) +
                " stages at least one layer of the model's " + std::to_string(layers),
            "list pp layer counts of at least 1 that sum to model.num_layers, or leave it empty for a cost-balanced "
            "split",
            {"parallel.pp", "model.num_layers"});
}

// train.recompute_layers x the pipeline stages' layers (parallel.pp_layers, or the
// cost-balanced split the engine builds when it is empty): every stage must have
// that many layers to recompute; under parallel.vpp every model chunk, which counts
// its own from its first layer.
void check_recompute_layers(const Checker& c) {
  const std::optional<int64_t>& n = c.config.train.recompute_layers;
  if (!n) return;
  c.require(*n >= 0, "train.recompute_layers", c.shown("train.recompute_layers") + " is negative",
            "choose how many layers of each stage recompute, 0 or more, or null for all");
  const bool chunks = c.config.parallel.vpp > 1;
  const std::vector<int64_t> layers = chunks ? virtual_stage_layers(c.config) : pipeline_layers(c.config);
  const int64_t smallest = *std::min_element(layers.begin(), layers.end());
  c.require(*n <= smallest, "train.recompute_layers",
            c.shown("train.recompute_layers") + " is more than the " + std::to_string(smallest) +
                (chunks ? " layers of the smallest model chunk (parallel.vpp " + c.shown("parallel.vpp") + ")"
                        : " layers of the smallest pipeline stage"),
            "choose at most " + std::to_string(smallest) + ", or null for all of each stage's layers",
            {"parallel.pp_layers", "parallel.pp", "parallel.vpp", "model.num_layers"});
}

// train.recompute_per_micro_batch x train.recompute, parallel.vpp, offload.ratio and
// the stages' layers: the planners choose how many of a stage's first layers
// recompute (planning/activation_mix.h) under the mode, with one model chunk per
// stage, beside an offload ratio they choose too, and budget every stage's memory as
// the smallest stage's (which the activation memory's worst case relies on).
void check_planned_recompute(const Checker& c) {
  const Config& config = c.config;
  if (!config.train.recompute_per_micro_batch) return;
  c.require(config.train.recompute != RecomputeMode::None, "train.recompute_per_micro_batch",
            c.shown("train.recompute_per_micro_batch") + " with train.recompute " + c.shown("train.recompute") +
                ": there is no recomputation to choose",
            "set train.recompute: selective or full, or train.recompute_per_micro_batch: false", {"train.recompute"});
  c.require(config.parallel.vpp == 1, "train.recompute_per_micro_batch",
            c.shown("train.recompute_per_micro_batch") + " with parallel.vpp " + c.shown("parallel.vpp") +
                ": the planners count a micro-batch's recomputed layers from its stage's first, one model chunk per "
                "stage",
            "set parallel.vpp: 1, or train.recompute_per_micro_batch: false", {"parallel.vpp"});
  c.require(!(config.offload.enabled && config.offload.ratio >= 0), "train.recompute_per_micro_batch",
            c.shown("train.recompute_per_micro_batch") + " with offload.ratio " + c.shown("offload.ratio") +
                ": a forced offload ratio leaves the planners nothing to choose",
            "set offload.ratio: -1 (chosen by the cost model), or train.recompute_per_micro_batch: false",
            {"offload.ratio", "offload.enabled"});
  const std::vector<int64_t> layers = pipeline_layers(config);
  c.require(std::adjacent_find(layers.begin(), layers.end(), std::not_equal_to<>()) == layers.end(),
            "train.recompute_per_micro_batch",
            c.shown("train.recompute_per_micro_batch") + " with pipeline stages of unequal layers: the planners "
                "budget every stage's memory as the smallest's, which a larger stage recomputing as many layers "
                "can exceed",
            "set parallel.pp_layers to equal counts (model.num_layers a multiple of parallel.pp), or "
            "train.recompute_per_micro_batch: false",
            {"parallel.pp_layers", "parallel.pp", "model.num_layers"});
}

// parallel.sequence_parallel x parallel.tp, model.arch and offload (which moves the
// same rows of every saved tensor, whereas sequence parallelism holds the norms' and
// the residual stream's for a shard of the rows).
void check_sequence_parallel(const Checker& c) {
  const Config& config = c.config;
  if (!config.parallel.sequence_parallel) return;
  c.require(config.parallel.tp > 1, "parallel.sequence_parallel",
            c.shown("parallel.sequence_parallel") + " with parallel.tp " + c.shown("parallel.tp") +
                ": there is no tensor-parallel group to split the sequence over",
            "raise parallel.tp above 1, or set parallel.sequence_parallel: false", {"parallel.tp"});
  c.require(!config.model.moe(), "parallel.sequence_parallel",
            c.shown("parallel.sequence_parallel") + " with model.arch " + c.shown("model.arch") +
                ": the trainer runs sequence parallelism for dense models only (Mixtral's experts make their own "
                "tensor-parallel collectives)",
            "set parallel.sequence_parallel: false", {"model.arch"});
  c.require(!may_offload(config), "parallel.sequence_parallel",
            c.shown("parallel.sequence_parallel") + offloaded_long_sequences(c) +
                ": offload moves the same rows of every saved tensor, which sequence parallelism shards",
            "set offload.enabled: false (long sequences then span hdp ranks in rings), or "
            "parallel.sequence_parallel: false",
            {"offload.enabled", "data.max_seq_len", "data.micro_batch_tokens"});
}

// parallel.comm x train.device (and, with check_files, this build)
void check_communicator(const Checker& c, bool check_files) {
  if (c.config.parallel.comm != CommMode::Nccl) return;
  c.require(c.config.train.device == Device::CUDA, "parallel.comm",
            c.shown("parallel.comm") + " needs train.device: cuda, not " + c.shown("train.device"),
            "NCCL moves GPU buffers; use parallel.comm: mpi (or auto) on the CPU", {"train.device"});
  // Whether this build has NCCL is a property of the machine, like the files:
  // not checked for a config read back from a checkpoint elsewhere.
  c.require(!check_files || nccl_compiled(), "parallel.comm",
            c.shown("parallel.comm") + " asked for, but this build has no NCCL (it needs the CUDA backend and libnccl)",
            "use parallel.comm: mpi or auto, or rebuild with CUDA and NCCL");
}

// train.attention cudnn x train.device x train.precision: cuDNN's fused attention
// runs bf16 on a GPU; anything else would fail at the first attention call.
void check_attention(const Checker& c) {
  if (c.config.train.attention != AttentionImpl::Cudnn) return;
  c.require(c.config.train.device == Device::CUDA && c.config.train.precision == DType::BF16, "train.attention",
            c.shown("train.attention") + " needs train.device: cuda and train.precision: bf16, not " +
                c.shown("train.device") + " and " + c.shown("train.precision"),
            "use train.attention: auto or own, or run bf16 on a GPU", {"train.device", "train.precision"});
}

// scheduler.cp x parallel.hdp; scheduler.policy static x data.max_seq_len x
// parallel.hdp x data.micro_batch_tokens
void check_static_grid(const Checker& c) {
  const SchedulerConfig& sc = c.config.scheduler;
  const DataConfig& d = c.config.data;
  const int64_t hdp = c.config.parallel.hdp;
  c.require(sc.cp == 0 || hdp % sc.cp == 0, "scheduler.cp",
            c.shown("scheduler.cp") + " does not divide parallel.hdp " + c.shown("parallel.hdp"),
            "the static grid is dp x cp = hdp; choose a divisor of " + std::to_string(hdp) + " or 0", {"parallel.hdp"});
  c.require(sc.policy != SchedulerPolicy::Static || d.max_seq_len <= hdp * d.micro_batch_tokens, "data.max_seq_len",
            c.shown("data.max_seq_len") + " does not fit the static grid: at most parallel.hdp x data.micro_batch_tokens = " +
                std::to_string(hdp * d.micro_batch_tokens) + " tokens",
            "lower data.max_seq_len, or raise parallel.hdp or data.micro_batch_tokens", {"parallel.hdp", "scheduler.policy"});
}

// Mixtral: model.num_layers x model.experts_per_token x data.micro_batch_tokens
// (or, with rings, data.max_seq_len x parallel.hdp). A forward's (token, choice)
// counts are kept as fp32, the form in which they travel between pipeline stages
// and ring members (model/model.h, routing_input): exact below 2^24. A forward is
// one micro-batch, or with sequences longer than a micro-batch a ring of at most
// hdp members, each holding at most the longest sequence (offload lets a member
// hold more than the capacity). The product is taken in double: the sizes are not
// checked yet (check_sizes).
void check_routing_counts(const Checker& c) {
  const ModelConfig& m = c.config.model;
  const DataConfig& d = c.config.data;
  if (!m.moe()) return;
  const bool rings = d.max_seq_len > d.micro_batch_tokens;
  const double forward_tokens = rings ? static_cast<double>(c.config.parallel.hdp) * static_cast<double>(d.max_seq_len)
                                      : static_cast<double>(d.micro_batch_tokens);
  c.require(static_cast<double>(m.num_layers) * forward_tokens * static_cast<double>(m.experts_per_token) <
                static_cast<double>(int64_t{1} << 24),
            "data.micro_batch_tokens",
            (rings ? "parallel.hdp " + c.shown("parallel.hdp") + " x data.max_seq_len " + c.shown("data.max_seq_len")
                   : c.shown("data.micro_batch_tokens")) +
                " x model.num_layers x model.experts_per_token reaches 2^24 with model.arch 'mixtral'",
            "the routing counts of a forward are exact below 2^24; use smaller micro-batches or sequences",
            rings ? std::vector<std::string>{"data.max_seq_len", "parallel.hdp", "model.num_layers",
                                             "model.experts_per_token"}
                  : std::vector<std::string>{"model.num_layers", "model.experts_per_token"});
}

// model sizes x data.micro_batch_tokens. Sizes are 64-bit: element counts and
// offsets are int64 (the model lays every parameter out in one flat buffer), byte
// counts size_t. A shape whose counts do not fit would wrap around and fail later
// with a meaningless bounds error, so the counts are made in double (exact enough
// to compare with 2^63) and must fit with room: the fp32 weights, their gradients
// and the two AdamW moments, 16 bytes a parameter, and one micro-batch's logits
// (micro_batch_tokens x vocab).
void check_sizes(const Checker& c) {
  const ModelConfig& m = c.config.model;
  const DataConfig& d = c.config.data;
  const ModelShape shape = m.shape();
  const double parameters = static_cast<double>(m.num_layers) * layer_parameters(shape) +
                            embedding_parameters(shape) + head_parameters(shape, 1);
  const double state_bytes = 16 * parameters;
  const double logits = static_cast<double>(d.micro_batch_tokens) * static_cast<double>(m.vocab_size);
  constexpr double kLimit = 0x1p62;  // bytes or elements: a quarter of what int64 counts
  if (state_bytes < kLimit && logits < kLimit) return;
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
  c.require(false, keys.front(), "too large to count: " + sizes + " make " + need + ", beyond 64-bit sizes (2^62 = 4.6e18)",
            "check these sizes for a typo; the largest models trained today have about 1e12 parameters", keys);
}

// ---------------------------------------------------------------------------
// Files: data.path (by data.format), scheduler.cost_file, train.init_from

// kind: a regular file, or a directory (checkpoints are directories).
enum class PathKind { File, Directory };
void check_path(const Checker& c, const std::string& path, const std::string& key, const std::string& hint,
                PathKind kind) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  std::string cwd;
  {
    std::error_code cwd_ec;
    cwd = fs::current_path(cwd_ec).string();
  }
  const std::string relative = fs::path(path).is_relative() ? " (relative to the working directory " + cwd + ")" : "";
  const char* noun = kind == PathKind::File ? "file" : "directory";
  c.require(fs::exists(status), key, std::string(noun) + " '" + path + "' does not exist" + relative, hint);
  c.require(kind != PathKind::File || !fs::is_directory(status), key,
            "'" + path + "' is a directory, not a file" + relative, hint);
  c.require(kind != PathKind::Directory || fs::is_directory(status), key,
            "'" + path + "' is not a directory" + relative, hint);
}

void check_named_files(const Checker& c) {
  const DataConfig& d = c.config.data;
  if (d.format == "megatron") {
    for (const char* ext : {".bin", ".idx"})
      check_path(c, d.path + ext, "data.path",
                 "with data.format megatron, data.path is the PREFIX of PREFIX.bin and PREFIX.idx (write them with "
                 "'trainer prepare-data --output-format megatron')",
                 PathKind::File);
  } else {
    check_path(c, d.path, "data.path",
               "point data.path at an HDF5 token dataset, or create this one with 'trainer make-corpus --output " +
                   d.path + "' (synthetic demo corpus) or 'trainer prepare-data' (from text)",
               PathKind::File);
  }
  const std::string& cost_file = c.config.scheduler.cost_file;
  if (!cost_file.empty() && cost_file != "profile")
    check_path(c, cost_file, "scheduler.cost_file",
               "point it at a cost file written by 'trainer profile', leave it empty for a model derived from FLOPs, "
               "or write profile to measure at start-up",
               PathKind::File);
  const std::string& init_from = c.config.train.init_from;
  if (!init_from.empty())
    check_path(c, init_from, "train.init_from",
               "point it at a checkpoint directory written by the trainer (CHECKPOINT_DIR/step-NNNNNNNN), or leave "
               "it empty to start from random weights",
               PathKind::Directory);
}

}  // namespace

void check_config(const Config& config, bool check_files) {
  check_model_section(config);
  const Checker c(config);
  check_key_rules(c);
  check_batch_holds_a_sequence(c);
  check_learning_rates(c);
  check_trace_window(c);
  check_layout(c);
  check_interleaving(c);
  check_pipeline_split(c);
  check_recompute_layers(c);
  check_planned_recompute(c);
  check_sequence_parallel(c);
  check_communicator(c, check_files);
  check_attention(c);
  check_static_grid(c);
  check_routing_counts(c);
  check_sizes(c);
  // files last, so that value errors are reported even before the data exists
  if (check_files) check_named_files(c);
}

}  // namespace hdp
