#include "config/schema.h"

#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "base/yaml_reader.h"
#include "spec/model_checks.h"

namespace hdp {
namespace {

// std::visit with one lambda per alternative.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// ---------------------------------------------------------------------------
// Entries

// member: of the section or of a struct it derives from (ParallelConfig's degrees).
template <class S, class M, class T>
Field field(const char* key, S Config::*section, T M::*member, const char* doc, KeyRule rule = {}) {
  return Field{key, [section, member](Config& c) -> FieldRef { return &((c.*section).*member); }, doc,
               std::move(rule)};
}

// An enum's names are its rule: a name the table lacks is refused while reading.
// member: of the section or of a struct it derives from (OptimConfig's schedule).
template <class S, class M, class E, size_t N>
Field enum_field(const char* key, S Config::*section, E M::*member, const EnumName<E> (&names)[N],
                 const char* noun, const char* doc) {
  return Field{key,
               [section, member, &names, noun](Config& c) -> FieldRef {
                 E* value = &((c.*section).*member);
                 auto name = [value, &names] { return std::string(enum_name(names, *value)); };
                 auto set_name = [value, &names](const std::string& text) {
                   const std::optional<E> parsed = enum_value(names, text);
                   if (parsed) *value = *parsed;
                   return parsed.has_value();
                 };
                 return EnumRef{name, set_name, noun, enum_choices(names)};
               },
               doc, KeyRule{}};
}

// ---------------------------------------------------------------------------
// Rules of one value

double number(const FieldRef& ref) {
  return std::visit(Overloaded{[](int* p) { return static_cast<double>(*p); },
                               [](int64_t* p) { return static_cast<double>(*p); },
                               [](uint64_t* p) { return static_cast<double>(*p); }, [](double* p) { return *p; },
                               [](const AutoCountRef& r) { return static_cast<double>(*r.count); },
                               [](const auto&) -> double { throw std::logic_error("config schema: not a number"); }},
                    ref);
}

const std::string& text(const FieldRef& ref) {
  const auto* p = std::get_if<std::string*>(&ref);
  if (!p) throw std::logic_error("config schema: not a string");
  return **p;
}

KeyRule rule(std::string doc_text, std::function<bool(double)> holds, std::string problem, std::string valid) {
  return KeyRule{doc_text, [holds](const FieldRef& r) { return holds(number(r)); }, problem, std::move(valid)};
}
// `also`: more of the rule, checked with the rules between keys, for the docs.
KeyRule positive_count(const std::string& also = "") {
  return rule(also.empty() ? "> 0" : "> 0; " + also, [](double v) { return v > 0; }, "{value} is not positive",
              "it must be at least 1");
}
KeyRule positive() {
  return rule("> 0", [](double v) { return v > 0; }, "{value} is not positive", "it must be greater than 0");
}
KeyRule non_negative(std::string valid = "it must be 0 or more", const std::string& also = "") {
  return rule(also.empty() ? ">= 0" : ">= 0; " + also, [](double v) { return v >= 0; }, "{value} is negative",
              std::move(valid));
}
KeyRule below_one(std::string valid) {
  return rule("in [0, 1)", [](double v) { return v >= 0 && v < 1; }, "{value} is outside [0, 1)", std::move(valid));
}
KeyRule not_empty(const char* doc_text, const char* problem, std::string valid) {
  return KeyRule{doc_text, [](const FieldRef& r) { return !text(r).empty(); }, problem, std::move(valid)};
}
// A rule stated for the docs and checked elsewhere: a model key's by
// spec/model_checks.h (model_issue: the one check of a model, for the config,
// `trainer plan`'s model files and Hugging Face import alike), a rule between keys
// or about a file by checks.cpp.
KeyRule stated(std::string doc_text) { return KeyRule{std::move(doc_text), {}, "", ""}; }
// train.spike_factor and train.grad_norm_spike_factor (run/numerical_guard.h).
KeyRule spike_factor_rule(const std::string& what) {
  return rule("0 or > 1", [](double v) { return v == 0 || v > 1; }, "{value} is not 0 or above 1",
              "choose 0 (no spike detection) or a factor above 1: a step whose " + what +
                  " exceeds it times the median of the recent good steps is skipped");
}

const std::vector<Section> kSchema = {
    {"model",
     {field("arch", &Config::model, &ModelConfig::arch,
            "architecture: `llama` (Hugging Face `LlamaForCausalLM`), `mistral` (`MistralForCausalLM`: LLaMA with "
            "an optional `sliding_window`) or `mixtral` (`MixtralForCausalLM`: a sparse mixture-of-experts block "
            "in place of each MLP)",
            stated("`llama`, `mistral` or `mixtral`")),
      field("vocab_size", &Config::model, &ModelConfig::vocab_size,
            "rows of the embedding table (258: the byte-level tokenizer's 256 bytes, BOS and EOS)",
            stated("> 0; at least the dataset's vocabulary")),
      field("hidden_size", &Config::model, &ModelConfig::hidden_size, "model width", stated("> 0")),
      field("num_layers", &Config::model, &ModelConfig::num_layers, "transformer blocks",
            stated("1 to " + std::to_string(kMaxLayers))),
      field("num_heads", &Config::model, &ModelConfig::num_heads, "query heads",
            stated("> 0; divides `hidden_size` into an even head dimension")),
      field("num_kv_heads", &Config::model, &ModelConfig::num_kv_heads,
            "key/value heads of grouped-query attention (`num_heads`: plain multi-head attention)",
            stated("> 0; divides `num_heads`")),
      field("ffn_hidden_size", &Config::model, &ModelConfig::ffn_hidden_size,
            "SwiGLU inner width, of each expert with `mixtral` (LLaMA: about 8/3 x `hidden_size`)",
            stated("> 0")),
      field("rope_theta", &Config::model, &ModelConfig::rope_theta, "RoPE base", stated("> 0")),
      enum_field("rope_scaling", &Config::model, &ModelConfig::rope_scaling, kRopeScalingNames, "RoPE scaling",
                 "how RoPE's frequencies are stretched for long contexts (Hugging Face `rope_scaling`'s "
                 "`rope_type`)"),
      field("rope_scaling_factor", &Config::model, &ModelConfig::rope_scaling_factor,
            "`llama3` only: what the long wavelengths' frequencies are divided by (`factor`)", stated(">= 1")),
      field("rope_low_freq_factor", &Config::model, &ModelConfig::rope_low_freq_factor,
            "`llama3` only: wavelengths above `rope_original_max_positions` / this are scaled (`low_freq_factor`)",
            stated("> 0")),
      field("rope_high_freq_factor", &Config::model, &ModelConfig::rope_high_freq_factor,
            "`llama3` only: wavelengths below `rope_original_max_positions` / this are kept; between the two "
            "the frequency is blended (`high_freq_factor`)",
            stated("> `rope_low_freq_factor`")),
      field("rope_original_max_positions", &Config::model, &ModelConfig::rope_original_max_positions,
            "`llama3` only: the context the model was first trained at (`original_max_position_embeddings`)",
            stated("> 0")),
      field("norm_eps", &Config::model, &ModelConfig::norm_eps, "RMSNorm epsilon", stated("> 0")),
      field("tie_embeddings", &Config::model, &ModelConfig::tie_embeddings,
            "share the input embedding with the output projection"),
      field("init_std", &Config::model, &ModelConfig::init_std, "standard deviation of the initial weights",
            stated("> 0")),
      field("sliding_window", &Config::model, &ModelConfig::sliding_window,
            "Mistral's sliding window W: a query sees the W most recent keys of its document, itself included; "
            "null: full causal attention",
            stated("null, or 1 to 2^31 - 1 with `arch` `mistral` or `mixtral`")),
      field("num_experts", &Config::model, &ModelConfig::num_experts,
            "`mixtral` only: experts per layer (Hugging Face `num_local_experts`)",
            stated("1 to " + std::to_string(kMaxExperts))),
      field("experts_per_token", &Config::model, &ModelConfig::experts_per_token,
            "`mixtral` only: the experts each token runs, k (`num_experts_per_tok`)",
            stated("in [1, `num_experts`]")),
      field("router_aux_loss_coef", &Config::model, &ModelConfig::router_aux_loss_coef,
            "`mixtral` only: the weight of the load-balancing loss added to the loss (Mixtral: 0.02)",
            stated(">= 0"))}},
    {"data",
     {field("path", &Config::data, &DataConfig::path,
            "the token dataset: an HDF5 file, or with `format: megatron` the PREFIX of PREFIX.bin and PREFIX.idx",
            not_empty("required; must exist", "required key is missing",
                      "set it to an HDF5 token dataset, e.g. data.path: data-cache/demo-corpus.h5 (make one with "
                      "'trainer make-corpus --output <path>' or 'trainer prepare-data')")),
      field("format", &Config::data, &DataConfig::format,
            "dataset format: `hdf5` (this trainer's file) or `megatron` (Megatron-LM's MMIDIDX v1)",
            KeyRule{"`hdf5` or `megatron`",
                    [](const FieldRef& r) { return text(r) == "hdf5" || text(r) == "megatron"; },
                    "unsupported dataset format {value}",
                    "choose hdf5 (this trainer's file) or megatron (Megatron-LM's PREFIX.bin + PREFIX.idx, data.path "
                    "= PREFIX; docs/dataset-format.md)"}),
      field("max_seq_len", &Config::data, &DataConfig::max_seq_len,
            "the longest training sequence; longer documents are split into pieces of at most this many tokens",
            rule(">= 2", [](double v) { return v >= 2; }, "{value} is too small",
                 "it must be at least 2 (a sequence needs an input and a next-token target)")),
      field("global_batch_tokens", &Config::data, &DataConfig::global_batch_tokens,
            "tokens per optimizer step (a batch never exceeds it)", stated(">= `max_seq_len`")),
      field("micro_batch_tokens", &Config::data, &DataConfig::micro_batch_tokens,
            "tokens one rank holds in one micro-batch; longer sequences span several ranks", positive_count()),
      field("shuffle", &Config::data, &DataConfig::shuffle, "shuffle the document order every epoch"),
      field("seed", &Config::data, &DataConfig::seed, "seed of the shuffle")}},
    {"optim",
     {field("lr", &Config::optim, &OptimConfig::lr, "peak learning rate", positive()),
      field("min_lr", &Config::optim, &OptimConfig::min_lr, "learning rate at the end of the decay",
            non_negative("choose 0 <= min_lr <= optim.lr")),
      field("warmup_steps", &Config::optim, &OptimConfig::warmup_steps, "steps of linear warmup from 0 to `lr`",
            non_negative()),
      enum_field("schedule", &Config::optim, &OptimConfig::kind, kLrScheduleNames, "schedule",
                 "the learning rate after the warmup (docs/configuration.md, \"Learning-rate schedules\")"),
      field("decay_steps", &Config::optim, &OptimConfig::decay_steps,
            "steps of the decay from `lr` to `min_lr`, whatever `train.steps` is; 0: `cosine` and `linear` decay "
            "until `train.steps`, `wsd` over `decay_fraction` of it",
            non_negative("it must be 0 (the default decay) or a number of steps")),
      field("decay_fraction", &Config::optim, &OptimConfig::decay_fraction,
            "`wsd` with `decay_steps` 0: the fraction of `train.steps` the decay takes, at the end of the run",
            rule("in [0, 1]", [](double v) { return v >= 0 && v <= 1; }, "{value} is outside [0, 1]",
                 "choose the fraction of train.steps the decay takes, e.g. 0.1 (MiniCPM) or 0.2")),
      field("weight_decay", &Config::optim, &OptimConfig::weight_decay, "decoupled weight decay", non_negative()),
      field("beta1", &Config::optim, &OptimConfig::beta1, "AdamW's decay of the first moment",
            below_one("choose 0 <= beta1 < 1, e.g. 0.9")),
      field("beta2", &Config::optim, &OptimConfig::beta2, "AdamW's decay of the second moment",
            below_one("choose 0 <= beta2 < 1, e.g. 0.95")),
      field("eps", &Config::optim, &OptimConfig::eps, "AdamW's epsilon in the denominator", positive()),
      field("grad_clip", &Config::optim, &OptimConfig::grad_clip,
            "clip the global gradient norm to this; 0 disables clipping",
            non_negative("it must be 0 or more (0 disables clipping)"))}},
    {"train",
     {field("steps", &Config::train, &TrainConfig::steps, "optimizer steps", positive_count()),
      field("seed", &Config::train, &TrainConfig::seed, "seed of the weight initialisation"),
      field("log_every", &Config::train, &TrainConfig::log_every, "log a metrics line every this many steps",
            positive_count()),
      field("run_dir", &Config::train, &TrainConfig::run_dir,
            "the run's directory: `metrics.jsonl`, `train.log` (rank 0's log, appended), `config.yaml` (the "
            "effective config) and, by default, `checkpoints/`; created at start-up",
            not_empty("not empty", "is empty", "name a directory, e.g. runs/my-run")),
      field("checkpoint_every", &Config::train, &TrainConfig::checkpoint_every,
            "save a checkpoint every this many steps; 0 disables checkpoints",
            non_negative("it must be 0 or more (0 disables checkpoints)")),
      field("checkpoint_dir", &Config::train, &TrainConfig::checkpoint_dir,
            "where checkpoints go; empty: `run_dir`/checkpoints (the effective config keeps it empty, so a config "
            "used for another run follows its `run_dir`)"),
      field("keep_checkpoints", &Config::train, &TrainConfig::keep_checkpoints,
            "the newest K complete checkpoints are kept, and the newest confirmed one when none of them is "
            "(`max_bad_steps`)",
            rule(">= 1", [](double v) { return v >= 1; }, "{value} is less than 1", "keep at least 1 checkpoint")),
      field("async_checkpoints", &Config::train, &TrainConfig::async_checkpoints,
            "write a checkpoint in a background thread from a host snapshot while training goes on"),
      field("checkpoint_budget", &Config::train, &TrainConfig::checkpoint_budget,
            "the share of the run's time checkpoints may cost (the training thread's wait and the background "
            "writer's CPU time, measured): a due checkpoint is deferred until its cost / this has passed since the "
            "previous one started; the last step and a stop are always saved; 0: every due checkpoint, waiting for "
            "the write in flight",
            below_one("choose a fraction of the run's time, e.g. 0.02, or 0 to save every due checkpoint")),
      field("reuse_checkpoint_dir", &Config::train, &TrainConfig::reuse_checkpoint_dir,
            "accept a `checkpoint_dir` whose newest checkpoint another run wrote"),
      enum_field("resume", &Config::train, &TrainConfig::resume, kResumeModeNames, "mode",
                 "whether a run continues from a checkpoint"),
      field("allow_schedule_change", &Config::train, &TrainConfig::allow_schedule_change,
            "resume even when this config's learning rate for the next step differs from the one the "
            "checkpoint's run would have used (a changed `train.steps` or `optim` schedule key)"),
      field("start_over", &Config::train, &TrainConfig::start_over,
            "with `resume: never`: delete the complete checkpoints in `checkpoint_dir` and the metrics in "
            "`run_dir` that a previous run left, and start from step 0 (without it such a run is refused)"),
      field("init_from", &Config::train, &TrainConfig::init_from,
            "a checkpoint directory whose weights start training, with fresh optimizer state; empty: random "
            "initialisation",
            stated("empty, or an existing directory")),
      field("allow_model_change", &Config::train, &TrainConfig::allow_model_change,
            "start from `init_from` although its model's numerics keys (`rope_theta`, the RoPE scaling keys, "
            "`norm_eps`, `sliding_window`, `experts_per_token`, `arch` between `llama` and `mistral`) differ from "
            "this config's, logging each; its shape keys must always match"),
      field("peak_flops", &Config::train, &TrainConfig::peak_flops,
            "the machine's peak FLOP/s, for the MFU figure; 0: measured, or a known GPU's datasheet figure",
            non_negative("it must be 0 or more (0 = measure with a GEMM probe)")),
      field("threads", &Config::train, &TrainConfig::threads,
            "OpenMP threads per rank; 0: the node's cores / its ranks",
            rule("0 to " + std::to_string(kMaxThreadsPerRank) + "; at most " + std::to_string(kThreadsPerCore) +
                     " x the cores the rank may run on",
                 [](double v) { return v >= 0 && v <= kMaxThreadsPerRank; },
                 "{value} is not between 0 and " + std::to_string(kMaxThreadsPerRank),
                 "choose 0 (the node's cores / its ranks) or a thread count up to " +
                     std::to_string(kMaxThreadsPerRank))),
      enum_field("device", &Config::train, &TrainConfig::device, kDeviceNames, "device",
                 "where a rank computes (`cuda`: the GPU of its local rank modulo the GPUs visible)"),
      field("tf32", &Config::train, &TrainConfig::tf32, "`cuda` only: fp32 GEMMs on TF32 tensor cores"),
      enum_field("attention", &Config::train, &TrainConfig::attention, kAttentionImplNames, "implementation",
                 "`cuda` only: which kernels run attention (cuDNN's in bf16 on sm_90 and newer; its backward "
                 "is not bit-reproducible, so `own` where resume must be bit-exact)"),
      enum_field("precision", &Config::train, &TrainConfig::precision, kPrecisionNames, "precision",
                 "the compute precision; not given: `bf16` on `cuda`, `fp32` on the other devices"),
      enum_field("recompute", &Config::train, &TrainConfig::recompute, kRecomputeModeNames, "mode",
                 "activation recomputation: what a layer keeps for backward and reruns in it (Korthikanti et al. "
                 "2022; docs/performance.md)"),
      field("recompute_layers", &Config::train, &TrainConfig::recompute_layers,
            "with `recompute` selective or full: how many layers of each pipeline stage recompute, counted from "
            "the stage's first layer (under `parallel.vpp` > 1, of each model chunk from its first); null: all; "
            "the others may offload; with `recompute_per_micro_batch`, the most a micro-batch recomputes",
            stated("null, or 0 to the smallest stage's (model chunk's) layers")),
      field("recompute_per_micro_batch", &Config::train, &TrainConfig::recompute_per_micro_batch,
            "false: every micro-batch recomputes `recompute_layers` layers; true: that many at most, chosen per "
            "micro-batch by the step planner with its offload ratio as the cheapest mix that fits (ByteScale's "
            "offload extended by recomputation; docs/planning.md), none in the micro-batches within "
            "`data.micro_batch_tokens`"),
      field("spike_factor", &Config::train, &TrainConfig::spike_factor,
            "a step whose loss exceeds this factor times the median of the recent good steps (from the second "
            "step on) is bad; 0: off",
            spike_factor_rule("loss")),
      field("grad_norm_spike_factor", &Config::train, &TrainConfig::grad_norm_spike_factor,
            "a step whose gradient norm exceeds this factor times the median of the recent good steps (from the "
            "second step on) is bad; 0: off",
            spike_factor_rule("gradient norm")),
      field("max_bad_steps", &Config::train, &TrainConfig::max_bad_steps,
            "this many bad steps in a row roll the run back to the newest confirmed checkpoint before them, "
            "or stop it when there is none",
            rule(">= 1", [](double v) { return v >= 1; }, "{value} is less than 1",
                 "choose how many bad steps in a row make the run roll back (or stop, without a checkpoint to "
                 "return to), at least 1 (1 = act at the first bad step)")),
      field("hang_timeout_s", &Config::train, &TrainConfig::hang_timeout_s,
            "seconds without progress (or a silent peer) after which the job is declared hung; 0: off",
            rule("0 or >= 1", [](double v) { return v == 0 || (v >= 1 && std::isfinite(v)); },
                 "{value} is not 0 or at least 1",
                 "choose the seconds without progress after which the job is declared hung, at least 1 (default "
                 "600), or 0 to turn hang detection off"))}},
    {"parallel",
     {field("tp", &Config::parallel, &ParallelConfig::tp, "tensor-parallel degree",
            positive_count("divides `model.num_kv_heads` and `model.ffn_hidden_size`")),
      field("pp", &Config::parallel, &ParallelConfig::pp, "pipeline stages",
            positive_count("at most `model.num_layers`")),
      Field{"hdp",
            [](Config& c) -> FieldRef { return AutoCountRef{&c.parallel.hdp, &c.parallel.hdp_auto}; },
            "hybrid-data-parallel degree (data and context parallelism in one dimension); `auto`: the job's "
            "training ranks / (`tp` x `pp`)",
            positive_count()},
      field("ep", &Config::parallel, &ParallelConfig::ep,
            "expert-parallel degree inside hdp (`model.arch: mixtral` only)",
            positive_count("divides `hdp` and `model.num_experts`")),
      field("vpp", &Config::parallel, &ParallelConfig::vpp,
            "model chunks per pipeline stage (interleaved 1F1B; `trainer plan --vpp` simulates it); above 1: dense "
            "models without offload, `pp_layers` empty",
            positive_count("1, or above 1 with `pp` > 1 and `pp` x `vpp` <= `model.num_layers`")),
      field("pp_layers", &Config::parallel, &ParallelConfig::pp_layers,
            "layers per pipeline stage; empty: the split that balances the stages' work",
            stated("empty, or `pp` counts of at least 1 summing to `model.num_layers`")),
      field("bucket_mb", &Config::parallel, &ParallelConfig::bucket_mb, "ZeRO-1 gradient bucket size in MiB",
            positive_count()),
      enum_field("comm", &Config::parallel, &ParallelConfig::comm, kCommModeNames, "communicator",
                 "what the tp, pp and hdp groups move tensors with"),
      field("sequence_parallel", &Config::parallel, &ParallelConfig::sequence_parallel,
            "with `tp` > 1: the norms and residual adds hold 1/tp of the sequence, and tensor parallelism's "
            "all-reduces become all-gathers and reduce-scatters (Megatron's sequence parallelism); dense models, "
            "without offload")}},
    {"scheduler",
     {enum_field("policy", &Config::scheduler, &SchedulerConfig::policy, kSchedulerPolicyNames, "policy",
                 "how a step's sequences are spread over the hdp ranks"),
      enum_field("balance", &Config::scheduler, &SchedulerConfig::balance, kSchedulerBalanceNames, "balance mode",
                 "`balance` only: what the balance scheduler evens out"),
      field("threshold", &Config::scheduler, &SchedulerConfig::threshold,
            "`balance` only: ranks more than this fraction below the busiest receive the next work",
            below_one("choose the fraction of the busiest rank's time below which a rank receives more work, "
                      "e.g. 0.05")),
      field("cp", &Config::scheduler, &SchedulerConfig::cp,
            "`static` only: the context-parallel degree; 0: the smallest divisor of `parallel.hdp` that fits",
            non_negative("it must be 0 (automatic) or a divisor of parallel.hdp", "divides `parallel.hdp`")),
      field("cost_file", &Config::scheduler, &SchedulerConfig::cost_file,
            "the planner's cost model: empty = derived from FLOPs, a file from `trainer profile`, or `profile` = "
            "measured at start-up",
            stated("empty, `profile` or an existing file"))}},
    {"offload",
     {field("enabled", &Config::offload, &OffloadConfig::enabled,
            "let the planner offload part of a long sequence's saved activations to host memory"),
      field("ratio", &Config::offload, &OffloadConfig::ratio,
            "force this offload ratio for every long sequence; negative: chosen by the cost model",
            rule("<= 1", [](double v) { return v <= 1; }, "{value} is above 1",
                 "choose a fraction in [0, 1], or a negative value to let the cost model choose")),
      field("bandwidth_gbs", &Config::offload, &OffloadConfig::bandwidth_gbs,
            "the host-device copy bandwidth the cost model assumes, GB/s", positive())}},
    {"loader",
     {enum_field("mode", &Config::loader, &LoaderConfig::mode, kLoaderModeNames, "mode",
                 "where the training ranks' data comes from"),
      field("servers", &Config::loader, &LoaderConfig::servers, "`remote` only: loader server ranks",
            positive_count()),
      field("timeout_s", &Config::loader, &LoaderConfig::timeout_s,
            "`remote` only: a loader rank silent this long ends the job", positive())}},
    {"trace",
     {field("every", &Config::trace, &TraceConfig::every,
            "trace `steps` consecutive steps out of every `every`; 0: off",
            non_negative("it must be 0 or more (0 = no tracing)")),
      field("steps", &Config::trace, &TraceConfig::steps, "steps traced per window",
            stated("between 1 and `every`")),
      field("dir", &Config::trace, &TraceConfig::dir, "where `rank-NNNNN.jsonl` go; empty: `train.run_dir`/trace")}},
    {"metrics",
     {field("tensorboard", &Config::metrics, &MetricsConfig::tensorboard,
            "also write the step metrics as TensorBoard event files into `train.run_dir`/tensorboard")}},
};

}  // namespace

const std::vector<Section>& config_schema() { return kSchema; }

const Section* find_section(const std::string& name) {
  for (const Section& s : kSchema)
    if (s.name == name) return &s;
  return nullptr;
}

const Field* find_field(const Section& section, const std::string& key) {
  for (const Field& f : section.fields)
    if (f.key == key) return &f;
  return nullptr;
}

const Field& schema_field(const std::string& path) {
  const size_t dot = path.find('.');
  const Section* section = find_section(path.substr(0, dot));
  const Field* f = section && dot != std::string::npos ? find_field(*section, path.substr(dot + 1)) : nullptr;
  if (!f) throw std::logic_error("config schema: no key " + path);
  return *f;
}

std::vector<std::string> section_names() {
  std::vector<std::string> names;
  for (const Section& s : kSchema) names.push_back(s.name);
  return names;
}

std::vector<std::string> key_names(const Section& section) {
  std::vector<std::string> names;
  for (const Field& f : section.fields) names.push_back(f.key);
  return names;
}

namespace {

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

void assign_name(const EnumRef& ref, const YAML::Node& node, const std::string& where, const std::string& key) {
  std::string name = ref.name();
  read_yaml_value(node, where, key, name);
  if (!ref.set_name(name))
    throw_config_error(where, key, "unknown " + std::string(ref.noun) + " '" + name + "'", "choose " + ref.choices);
}

}  // namespace

std::string value_text(const FieldRef& ref) {
  return std::visit(Overloaded{[](const EnumRef& e) { return "'" + e.name() + "'"; },
                               [](const AutoCountRef& r) {
                                 return *r.automatic ? std::string("'auto'") : std::to_string(*r.count);
                               },
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

std::string type_name(const FieldRef& ref) {
  return std::visit(Overloaded{[](const EnumRef&) -> std::string { return "name"; },
                               [](const AutoCountRef&) -> std::string { return "integer or `auto`"; },
                               [](auto* p) -> std::string {
                                 using T = std::remove_pointer_t<decltype(p)>;
                                 if constexpr (std::is_same_v<T, std::string>) return "string";
                                 else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of integers";
                                 else if constexpr (std::is_same_v<T, std::optional<int64_t>>) return "integer or null";
                                 else if constexpr (std::is_same_v<T, bool>) return "boolean";
                                 else if constexpr (std::is_same_v<T, double>) return "number";
                                 else if constexpr (std::is_same_v<T, uint64_t>) return "non-negative integer";
                                 else return "integer";
                               }},
                    ref);
}

void emit_value(YAML::Emitter& out, const FieldRef& ref) {
  std::visit(Overloaded{[&](const EnumRef& e) { out << YAML::DoubleQuoted << e.name(); },
                        [&](const AutoCountRef& r) {
                          if (*r.automatic) out << "auto";
                          else out << *r.count;
                        },
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
             ref);
}

void assign(const FieldRef& ref, const YAML::Node& node, const std::string& where, const std::string& key) {
  std::visit(Overloaded{[&](const EnumRef& e) { assign_name(e, node, where, key); },
                        [&](const AutoCountRef& r) {
                          *r.automatic = node.IsScalar() && node.Scalar() == "auto";
                          if (*r.automatic) return;
                          try {
                            read_yaml_value(node, where, key, *r.count);
                          } catch (const ConfigError& e) {
                            throw ConfigError(std::string(e.what()) + ", or auto");
                          }
                        },
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

}  // namespace hdp
