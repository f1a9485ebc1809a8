#include "trainer/plan_command.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "base/yaml_reader.h"
#include "data/length_distributions.h"
#include "whatif/simulator.h"
#include "whatif/step_measure.h"
#include "planning/pipeline_schedule.h"
#include "planning/stage_split.h"
#include "trainer/command_line.h"
#include "trainer/commands.h"
#include "config/model_file.h"

namespace hdp {

namespace {

// ---------------------------------------------------------------------------
// Cluster files: one flat map, every key known, every value typed. (Model files
// are the config's model section: read_model_file, config/model_file.h.)

YamlMap read_flat_file(const std::string& path, const std::string& kind, const std::string& example,
                       const std::vector<std::string>& required, const std::vector<std::string>& optional) {
  const YamlMap map = YamlDocument::read_file(path, kind, "pass a " + kind + " file such as " + example).root_map();
  std::vector<std::string> known = required;
  known.insert(known.end(), optional.begin(), optional.end());
  map.allow_only(known);
  for (const std::string& key : required)
    if (!map.has(key)) map.fail(key, "required key is missing");
  return map;
}

// A range check of planning/ (std::invalid_argument naming the key) as a file error.
[[noreturn]] void refuse_file(const std::string& path, const std::invalid_argument& e) {
  throw_config_error(path, "", std::string("key ") + e.what(), "");
}

const char* const kPlanHelp = R"(usage: trainer plan --cluster HW.yaml --model MODEL.yaml --gpus N --context L
                    --global-batch-tokens B --lengths DIST [options]

Plans one global batch with each policy and simulates the training step on the
described cluster (docs/planning.md). Prints per policy: planning time, step time,
tokens/s, speed-up over static, idle fraction, attention traffic and how many ranks
each long sequence spans.

  --cluster FILE          cluster description (configs/cluster/h100.yaml)
  --model FILE            model shape (configs/models/llama-7b.yaml, ...)
  --gpus N                GPUs in the job; hdp = N / (tp x pp)
  --context L             longest sequence; longer documents are cut into L pieces
  --global-batch-tokens B tokens per step (K and M suffixes: 32M = 33554432)
  --lengths DIST          byted | github (built-in distributions), a file of document
                          lengths (one per line), or an HDF5 token dataset
  --seed S                sampling seed (default 1)
  --tp T --pp P           tensor and pipeline parallel degrees (default 1, 1); --pp auto
                          plans every pp whose tp x pp divides the GPUs (at most the
                          layers) and keeps the one whose fastest policy simulates
                          the shortest step
  --vpp V                 model chunks per pipeline stage: interleaved 1F1B over
                          pp x V virtual stages (default 1: 1F1B; V > 1 needs pp > 1)
  --capacity C            tokens per rank and micro-batch (default: derived from memory)
  --cp N                  the static policy's context-parallel degree (default: the
                          smallest divisor of hdp that fits the longest sequence)
  --ep E                  expert parallelism of a mixture-of-experts model: E must
                          divide hdp and num_experts (default: each such E is
                          planned and simulated, the fastest step is kept)
  --recompute MODE        activation recomputation of every layer: none, selective,
                          full, or auto (default): per policy the mode whose
                          simulated step is shortest (offload only with none),
                          auto also trying none+selective and none+full: a
                          micro-batch above C recomputes some layers in that mode
                          and offloads others, whichever mix the cost model
                          predicts cheapest; under --sequence-parallel auto (the
                          default here) each also with sequence parallelism
  --sequence-parallel SP  on, off or auto: with --tp above 1 and a dense model, the
                          norms and residual adds hold 1/tp of the sequence
                          (parallel.sequence_parallel), which divides their saved
                          activations and the stage boundaries' sends by tp; no
                          offload with it, as the trainer runs it. auto plans each
                          recompute setup with it and without it, per policy keeping
                          the shortest step (the recompute column says "+sp" where
                          it won); off where tp is 1 or the model has
                          experts. Default: auto under
                          --recompute auto, off with a fixed mode
  --policies LIST         comma-separated, from static, naive, naive-no-offload,
                          balance and balance-deep (default static,naive,balance);
                          balance-deep also tries each candidate with the deepest
                          pipeline warm-ups memory allows, a schedule only the
                          simulator runs (the trainer runs 1F1B)
  --no-check              skip check_plan on each plan (slow for very large rings;
                          the simulator still detects deadlocks)
  --trace FILE.json       Chrome trace of the simulated step (one file per policy:
                          FILE-POLICY.json when several policies run)
)";

// ---------------------------------------------------------------------------
// Output helpers.

std::string grouped(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  std::string digits = buf, out;
  const bool negative = !digits.empty() && digits[0] == '-';
  if (negative) digits.erase(0, 1);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (negative ? "-" : "") + out;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string human_tokens(int64_t v) {
  if (v >= 1024 * 1024 && v % (1024 * 1024) == 0) return std::to_string(v / (1024 * 1024)) + "M";
  if (v >= 1024 && v % 1024 == 0) return std::to_string(v / 1024) + "K";
  return grouped(static_cast<double>(v));
}

std::string trace_path(const std::string& path, const std::string& policy, bool several) {
  if (!several) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + policy + p.extension().string())).string();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Why the trainer would not run sequence parallelism for this model at this tp (its
// config checks refuse parallel.sequence_parallel with tp 1 and with a mixture of
// experts, whose experts make their own tensor-parallel collectives); none: it would.
std::optional<std::string> sequence_parallel_issue(const ModelShape& model, int tp) {
  if (tp < 2) return "sequence parallelism needs tp above 1, not " + std::to_string(tp);
  if (model.experts > 1)
    return "sequence parallelism is for dense models: the trainer refuses parallel.sequence_parallel with " +
           model.name + "'s " + std::to_string(model.experts) + " experts";
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------

HardwareProfile load_cluster_file(const std::string& path) {
  const YamlMap y = read_flat_file(
      path, "cluster", "configs/cluster/h100.yaml",
      {"gpus_per_node", "peak_bf16_flops", "achievable_fraction", "hbm_bytes", "hbm_bytes_per_s", "reserved_bytes",
       "nvlink_bytes_per_s", "internode_bytes_per_s", "intranode_latency_s", "internode_latency_s", "pcie_bytes_per_s"},
      {"name", "host_bytes_per_node", "link_efficiency", "gemm_half_rows", "attention_half_rows"});
  HardwareProfile h;
  h.name = y.get_or<std::string>("name", std::filesystem::path(path).stem().string());
  const int64_t gpus_per_node = y.get<int64_t>("gpus_per_node");
  if (gpus_per_node < 1 || gpus_per_node > 1 << 20)
    y.fail("gpus_per_node", std::to_string(gpus_per_node) + " is out of range", "it must be from 1 to 1048576");
  h.gpus_per_node = static_cast<int>(gpus_per_node);
  h.peak_flops = y.get<double>("peak_bf16_flops");
  h.achievable_fraction = y.get<double>("achievable_fraction");
  h.hbm_bytes = y.get<double>("hbm_bytes");
  h.hbm_bytes_per_s = y.get<double>("hbm_bytes_per_s");
  h.reserved_bytes = y.get<double>("reserved_bytes");
  h.nvlink_bytes_per_s = y.get<double>("nvlink_bytes_per_s");
  h.internode_bytes_per_s = y.get<double>("internode_bytes_per_s");
  h.intranode_latency_s = y.get<double>("intranode_latency_s");
  h.internode_latency_s = y.get<double>("internode_latency_s");
  h.pcie_bytes_per_s = y.get<double>("pcie_bytes_per_s");
  h.host_bytes_per_node = y.get_or<double>("host_bytes_per_node", h.host_bytes_per_node);
  h.link_efficiency = y.get_or<double>("link_efficiency", h.link_efficiency);
  h.gemm_half_rows = y.get_or<double>("gemm_half_rows", h.gemm_half_rows);
  h.attention_half_rows = y.get_or<double>("attention_half_rows", h.attention_half_rows);
  try {
    validate_hardware(h);
  } catch (const std::invalid_argument& e) {
    refuse_file(path, e);
  }
  return h;
}

ModelShape load_model_file(const std::string& path) {
  const ModelFile file = read_model_file(path);
  ModelShape shape = file.model.shape();
  shape.name = file.name;
  return shape;
}

std::vector<int64_t> global_batch_lengths(const std::string& source, int64_t context, int64_t global_batch_tokens,
                                          uint64_t seed, std::string* description) {
  const std::vector<std::string> names = builtin_distribution_names();
  if (std::find(names.begin(), names.end(), source) != names.end()) {
    if (description) *description = "built-in distribution '" + source + "', seed " + std::to_string(seed);
    return sample_global_batch(builtin_distribution(source), context, global_batch_tokens, seed);
  }
  if (!std::filesystem::exists(source)) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    throw LengthsInputError("--lengths '" + source + "' is neither a built-in distribution (" + list +
                            ") nor an existing file");
  }
  char magic[8] = {};
  {
    std::ifstream in(source, std::ios::binary);
    in.read(magic, sizeof magic);
  }
  if (std::string(magic, 8) == std::string("\x89HDF\r\n\x1a\n", 8)) {
    if (description) *description = "HDF5 dataset '" + source + "', shuffle seed " + std::to_string(seed);
    return dataset_global_batch(source, context, global_batch_tokens, seed);
  }
  const std::vector<int64_t> documents = read_length_file(source);
  if (description) *description = "lengths file '" + source + "' (" + std::to_string(documents.size()) + " documents, in order)";
  size_t next = 0;
  return fill_global_batch([&]() -> int64_t { return next < documents.size() ? documents[next++] : 0; }, context,
                           global_batch_tokens);
}

PlanSetup make_plan_setup(const HardwareProfile& hardware, const ModelShape& model, int gpus, int tp, int pp,
                          int64_t context, int64_t capacity, int ep, int vpp, RecomputeMode recompute,
                          bool sequence_parallel, RecomputeMode mixed) {
  if (tp < 1 || pp < 1 || gpus < 1 || vpp < 1) throw PlanInputError("gpus, tp, pp and vpp must be at least 1");
  if (mixed != RecomputeMode::None && recompute != RecomputeMode::None)
    throw PlanInputError("recomputation mixed with offload needs recompute none for every layer");
  // A micro-batch's recomputed layers are the first of its stage: one chunk per stage.
  if (mixed != RecomputeMode::None && vpp > 1)
    throw PlanInputError("recomputation mixed with offload is planned with one model chunk per stage (vpp 1)");
  if (sequence_parallel) {
    if (const std::optional<std::string> issue = sequence_parallel_issue(model, tp)) throw PlanInputError(*issue);
    if (mixed != RecomputeMode::None)
      throw PlanInputError("recomputation mixed with offload needs offload, which sequence parallelism excludes");
  }
  if (gpus % (tp * pp) != 0)
    throw PlanInputError(std::to_string(gpus) + " GPUs are not a multiple of tp x pp = " + std::to_string(tp * pp));
  PlanSetup s;
  s.hardware = hardware;
  s.model = model;
  s.layout = {tp, pp, gpus / (tp * pp), 1, vpp};
  s.ep = ep;
  s.recompute = recompute;
  s.mixed = mixed;
  s.sequence_parallel = sequence_parallel;
  try {
    const std::vector<int64_t> virtual_stage_layers = stage_layer_split(model, tp, pp, context, vpp);
    s.stage_layers = layers_per_stage(virtual_stage_layers, pp);
    s.memory = memory_budget(model, hardware, s.layout, virtual_stage_layers, ep, recompute, sequence_parallel);
    s.costs = make_step_costs(model, hardware, s.layout, virtual_stage_layers, ep, recompute, sequence_parallel);
    if (mixed != RecomputeMode::None) {
      s.costs.recomputed =
          make_step_costs(model, hardware, s.layout, virtual_stage_layers, ep, mixed, sequence_parallel).cost;
    }
  } catch (const std::invalid_argument& e) {
    throw PlanInputError(model.name + " with tp " + std::to_string(tp) + ", pp " + std::to_string(pp) +
                         (vpp > 1 ? ", vpp " + std::to_string(vpp) : std::string()) +
                         (ep > 1 ? ", ep " + std::to_string(ep) : std::string()) + " on " + hardware.name + ": " +
                         e.what());
  }
  s.settings.hdp = s.layout.hdp;
  s.settings.capacity = capacity > 0 ? capacity : s.memory.capacity;
  s.settings.layers_per_stage = *std::min_element(s.stage_layers.begin(), s.stage_layers.end());
  s.settings.pipeline_stages = pp;
  s.settings.ep = ep;
  s.settings.cost = s.costs.cost;
  s.settings.cost.b1 += all_to_all_seconds_per_token(s.costs);
  s.settings.cost.embedding_seconds_per_token = s.costs.embedding_seconds_per_token;
  s.settings.cost.head_seconds_per_token = s.costs.head_seconds_per_token;
  // Each GPU's share of its node's host memory bounds what it offloads.
  s.settings.offload.host_bytes_per_rank = hardware.host_bytes_per_node / hardware.gpus_per_node;
  s.settings.offload.enabled = recompute == RecomputeMode::None && !sequence_parallel;
  if (mixed != RecomputeMode::None) {
    s.settings.recompute.max_layers = s.settings.layers_per_stage;
    s.settings.recompute.recomputed = s.costs.recomputed;
  }
  s.balance.mode = pp > 1 ? BalanceMode::Pipeline : BalanceMode::DataParallel;
  return s;
}

// plan_balance with the simulated step as its measure (and its micro-batches' seconds
// to re-time one-stage plans by); deeper_warmup as BalanceSettings'.
StepPlan simulated_balance(std::span<const int64_t> l, const PlanSetup& s, bool deeper_warmup) {
  BalanceSettings balance = s.balance;
  balance.deeper_warmup = deeper_warmup;
  balance.step_seconds = simulated_step_measure(l, s.costs);
  balance.micro_batch_seconds = simulated_micro_batch_measure(l, s.costs);
  return plan_balance(l, s.settings, balance);
}

const std::vector<std::pair<std::string, Planner>>& plan_policies() {
  static const std::vector<std::pair<std::string, Planner>> policies = {
      {policy_name(SchedulerPolicy::Static),
       [](std::span<const int64_t> l, const PlanSetup& s) { return plan_static(l, s.settings, s.static_cp); }},
      {policy_name(SchedulerPolicy::Naive),
       [](std::span<const int64_t> l, const PlanSetup& s) { return plan_naive(l, s.settings); }},
      // Algorithm 1 without selective offload: rings sized by device memory alone
      // (ByteScale's ablation step "dynamic communication").
      {"naive-no-offload",
       [](std::span<const int64_t> l, const PlanSetup& s) {
         PlannerSettings st = s.settings;
         st.offload.enabled = false;
         return plan_naive(l, st);
       }},
      // The balance scheduler comparing its candidates by the simulated step.
      {policy_name(SchedulerPolicy::Balance),
       [](std::span<const int64_t> l, const PlanSetup& s) { return simulated_balance(l, s, false); }},
      // The same with deeper pipeline warm-ups as candidates (simulated only).
      {"balance-deep",
       [](std::span<const int64_t> l, const PlanSetup& s) {
         // read_plan_request refuses it with --vpp above 1.
         if (s.layout.vpp > 1) throw std::logic_error("balance-deep with interleaved pipeline stages");
         return simulated_balance(l, s, true);
       }},
  };
  return policies;
}

const Planner& plan_policy(const std::string& name) {
  std::string names;
  for (const auto& [n, planner] : plan_policies()) {
    if (n == name) return planner;
    names += (names.empty() ? "" : ", ") + n;
  }
  throw PlanInputError("unknown policy '" + name + "' (valid: " + names + ")");
}

StepBound simulated_step_bound(const PlanSetup& setup, std::span<const int64_t> lengths) {
  std::vector<double> tails;
  for (int s = 0; s < setup.layout.pp; ++s) tails.push_back(gradient_sync(setup.costs, s).seconds());
  return step_lower_bound(lengths, setup.settings, setup.stage_layers, tails);
}

namespace {

// What `trainer plan` is asked to do.
struct PlanRequest {
  std::string cluster_path, model_path, lengths_source;
  int64_t gpus = 0, context = 0, batch_tokens = 0, seed = 1, tp = 1, vpp = 1, capacity = 0, cp = 0;
  int64_t pp = 1;  // 0: auto, every pipeline degree the GPUs and layers allow is tried
  int64_t ep = 0;  // 0: every ep the model allows is tried (1 for a dense model)
  std::optional<RecomputeMode> recompute;  // none: auto, every mode tried per policy
  std::optional<bool> sequence_parallel;   // --sequence-parallel on or off; none: auto
  std::optional<std::string> trace;
  bool check = true;
  std::vector<std::string> policies;  // known, each once, in the order given
};

// "static,naive,,static" -> {"static", "naive"}; an unknown name is a PlanInputError.
std::vector<std::string> policy_list(const std::string& list) {
  std::vector<std::string> policies;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    if (name.empty()) continue;
    plan_policy(name);  // validates
    if (std::find(policies.begin(), policies.end(), name) == policies.end()) policies.push_back(name);
  }
  if (policies.empty()) throw UsageError("--policies names no policy");
  return policies;
}

// --sequence-parallel was a flag: without a value (last, or before another option) it
// is refused, naming what it meant, before Arguments reads a neighbour as its value.
void refuse_bare_sequence_parallel(const std::vector<std::string>& raw) {
  for (size_t i = 0; i < raw.size(); ++i)
    if (raw[i] == "--sequence-parallel" && (i + 1 == raw.size() || raw[i + 1].rfind("--", 0) == 0))
      throw UsageError("--sequence-parallel takes a value now: on (what the bare flag meant), off or auto (the "
                       "default)");
}

PlanRequest read_plan_request(Arguments& args) {
  PlanRequest r;
  r.cluster_path = args.required("--cluster");
  r.model_path = args.required("--model");
  r.gpus = args.integer("--gpus", std::nullopt, 1);
  r.context = args.integer("--context", std::nullopt, 1);
  r.batch_tokens = args.integer("--global-batch-tokens", std::nullopt, 1);
  r.lengths_source = args.required("--lengths");
  r.seed = args.integer("--seed", 1, 0);
  r.tp = args.integer("--tp", 1, 1);
  const std::string pp = args.option("--pp").value_or("1");
  r.pp = pp == "auto" ? 0 : Arguments({"--pp", pp}).integer("--pp", 1, 1);
  r.vpp = args.integer("--vpp", 1, 1);
  r.capacity = args.integer("--capacity", 0, 0);
  r.cp = args.integer("--cp", 0, 0);
  r.ep = args.integer("--ep", 0, 1);
  const std::string recompute = args.option("--recompute").value_or("auto");
  if (recompute != "auto") {
    r.recompute = enum_value(kRecomputeModeNames, recompute);
    if (!r.recompute)
      throw UsageError("--recompute '" + recompute + "': choose auto, " + enum_choices(kRecomputeModeNames));
  }
  // A fixed --recompute plans the setup asked for: sequence parallelism off unless asked.
  const std::string sequence_parallel = args.option("--sequence-parallel").value_or(r.recompute ? "off" : "auto");
  if (sequence_parallel == "on" || sequence_parallel == "off") {
    r.sequence_parallel = sequence_parallel == "on";
  } else if (sequence_parallel != "auto") {
    throw UsageError("--sequence-parallel '" + sequence_parallel + "': choose auto, on or off");
  }
  r.trace = args.option("--trace");
  r.check = !args.flag("--no-check");
  const std::string policies = args.option("--policies").value_or("static,naive,balance");
  args.expect_empty();
  if (r.gpus > 1 << 24 || r.tp > 1 << 10 || r.pp > 1 << 10 || r.vpp > 1 << 10 || r.ep > 1 << 20)
    throw UsageError("--gpus, --tp, --pp, --vpp or --ep is implausibly large");
  r.policies = policy_list(policies);
  if (r.pp == 0 && r.vpp > 1)
    throw UsageError("--pp auto tries one model chunk per stage; drop --vpp or give --pp");
  if (r.vpp > 1 && std::ranges::count(r.policies, std::string("balance-deep")) > 0)
    throw UsageError("--policies balance-deep runs one model chunk per stage; drop --vpp");
  return r;
}

// One global batch and where it came from.
struct PlanBatch {
  std::vector<int64_t> lengths;
  std::string description;
  double sample_seconds = 0;
  int64_t tokens = 0, longest = 0;
};

PlanBatch draw_batch(const PlanRequest& r) {
  PlanBatch b;
  const auto t0 = std::chrono::steady_clock::now();
  b.lengths = global_batch_lengths(r.lengths_source, r.context, r.batch_tokens, static_cast<uint64_t>(r.seed),
                                   &b.description);
  b.sample_seconds = seconds_since(t0);
  if (b.lengths.empty()) throw LengthsInputError("--lengths '" + r.lengths_source + "' gives no sequences");
  for (int64_t x : b.lengths) b.tokens += x, b.longest = std::max(b.longest, x);
  return b;
}

// The header: the model, the cluster, the layout and the batch being planned.
void print_model_and_cluster(const PlanRequest& r, const PlanSetup& setup) {
  const ModelShape& model = setup.model;
  const HardwareProfile& hw = setup.hardware;
  const ModelCosts mc = model_costs(model, setup.layout.tp, setup.layout.pp, setup.recompute, setup.sequence_parallel);
  const double params = static_cast<double>(model.layers) * mc.layer_parameters + mc.embedding_parameters +
                        mc.head_parameters;
  // A token runs experts_per_token of the experts: the parameters behind its FLOPs.
  const double idle_experts = static_cast<double>(model.experts - model.experts_per_token) /
                              static_cast<double>(model.experts) * mc.expert_parameters;
  const std::string active =
      model.experts > 1 ? ", " + fixed((params - static_cast<double>(model.layers) * idle_experts) / 1e9, 2) +
                              " B active per token"
                        : "";
  std::printf("model    %s: %lld layers, hidden %lld, %lld heads / %lld KV, FFN %lld%s, vocab %lld%s (%.2f B parameters%s)\n",
              model.name.c_str(), static_cast<long long>(model.layers), static_cast<long long>(model.hidden),
              static_cast<long long>(model.heads), static_cast<long long>(model.kv_heads),
              static_cast<long long>(model.ffn),
              model.experts > 1 ? (" x " + std::to_string(model.experts) + " experts, top-" +
                                   std::to_string(model.experts_per_token)).c_str()
                                : "",
              static_cast<long long>(model.vocab),
              model.window > 0 ? (", sliding window " + std::to_string(model.window)).c_str() : "", params / 1e9,
              active.c_str());
  std::printf("cluster  %s: %lld GPUs (%lld nodes of %d); %.1f TFLOP/s per GPU (%.1f peak x %.2f)\n", hw.name.c_str(),
              static_cast<long long>(r.gpus), static_cast<long long>((r.gpus + hw.gpus_per_node - 1) / hw.gpus_per_node),
              hw.gpus_per_node, hw.flops_per_second() / 1e12, hw.peak_flops / 1e12, hw.achievable_fraction);
  std::string split;
  for (int64_t l : setup.stage_layers) {
    if (!split.empty()) split += '/';
    split += std::to_string(l);
  }
  std::string experts;
  if (model.experts > 1) {
    experts = "; ep " + std::to_string(setup.ep) + " (" + std::to_string(model.experts / setup.ep) + " of " +
              std::to_string(model.experts) + " experts per GPU";
    if (setup.ep > 1)
      experts += ", all-to-all at " + fixed(setup.costs.all_to_all_bytes_per_s / 1e9, 0) + " GB/s, " +
                 fixed(all_to_all_seconds_per_token(setup.costs) * 1e9, 1) + " ns per token and layer";
    experts += ")";
  }
  std::string chunks;
  if (setup.layout.vpp > 1) {
    chunks = " (interleaved 1F1B, vpp " + std::to_string(setup.layout.vpp) + ": layers per virtual stage ";
    for (size_t v = 0; v < setup.costs.chunk_layers.size(); ++v)
      chunks += (v > 0 ? "/" : "") + std::to_string(setup.costs.chunk_layers[v]);
    chunks += ")";
  }
  std::printf("layout   tp %d%s x pp %d x hdp %d%s; layers per stage %s%s\n", setup.layout.tp,
              setup.sequence_parallel ? " (sequence parallel)" : "", setup.layout.pp, setup.layout.hdp, experts.c_str(),
              split.c_str(), chunks.c_str());
  const int s0 = setup.memory.limiting_stage;
  // What memory_budget counts in flight on that stage: (micro-batch, chunk) pairs over its largest chunk.
  int64_t chunk_layers = setup.stage_layers[s0];
  if (setup.layout.vpp > 1) {
    chunk_layers = 0;
    for (size_t v = s0; v < setup.costs.chunk_layers.size(); v += setup.layout.pp)
      chunk_layers = std::max(chunk_layers, setup.costs.chunk_layers[v]);
  }
  std::printf("capacity C = %s tokens per rank and micro-batch (%s stage %d: (%.1f GB HBM - %.1f reserved - "
              "%.1f weights, gradients, optimizer shard) / (%d in flight x %lld layers x %.1f KB per token and layer) "
              "= %s)\n",
              grouped(static_cast<double>(setup.settings.capacity)).c_str(),
              r.capacity > 0 ? "--capacity; derived from memory would be, at" : "derived from memory at",
              s0, hw.hbm_bytes / 1e9, hw.reserved_bytes / 1e9, setup.memory.static_bytes[s0] / 1e9,
              pipeline_slots(s0, setup.layout.pp, setup.layout.vpp), static_cast<long long>(chunk_layers),
              mc.saved_bytes_per_token / 1e3,
              grouped(static_cast<double>(setup.memory.capacity)).c_str());
}

void print_batch(const PlanRequest& r, const PlanBatch& b) {
  std::printf("batch    %s: %s tokens in %s sequences (context %s, longest %s); tokens in sequences > 128K: %.1f%%, "
              "> 256K: %.1f%%, > 1M: %.1f%%\n",
              b.description.c_str(), grouped(static_cast<double>(b.tokens)).c_str(),
              grouped(static_cast<double>(b.lengths.size())).c_str(), human_tokens(r.context).c_str(),
              human_tokens(b.longest).c_str(), 100 * token_share_above(b.lengths, 128 * 1024),
              100 * token_share_above(b.lengths, 256 * 1024), 100 * token_share_above(b.lengths, 1024 * 1024));
  std::printf("         (batch drawn in %.3f s)\n\n", b.sample_seconds);
}

// "none", "selective", "full", or with recomputation mixed into offload (PlanSetup::mixed)
// "none+selective", "none+full"; "+sp" under sequence parallelism ("full+sp").
std::string setup_label(const PlanSetup& s) {
  std::string label = enum_name(kRecomputeModeNames, s.recompute);
  if (s.mixed != RecomputeMode::None) label += std::string("+") + enum_name(kRecomputeModeNames, s.mixed);
  if (s.sequence_parallel) label += "+sp";
  return label;
}

// The micro-batches of a plan above its capacity and the activation mixes they got
// (planning/activation_mix.h).
struct ActivationMixStats {
  int64_t over = 0, recomputing = 0, offloading = 0;
  int64_t most_layers = 0;
  double most_ratio = 0;
};

ActivationMixStats activation_mix_stats(const StepPlan& plan) {
  ActivationMixStats m;
  for (const auto& rank : plan.ranks)
    for (const PlannedMicroBatch& mb : rank) {
      if (mb.tokens() <= plan.capacity) continue;
      ++m.over;
      m.recomputing += mb.recompute_layers > 0;
      m.offloading += mb.offload_ratio > 0;
      m.most_layers = std::max(m.most_layers, mb.recompute_layers);
      m.most_ratio = std::max(m.most_ratio, mb.offload_ratio);
    }
  return m;
}

// One policy's plan of the batch and its simulated step.
struct PolicyOutcome {
  std::string name;
  std::string failure;  // non-empty: the planner could not place the batch
  std::string recompute;  // the setup's (setup_label)
  ActivationMixStats mixes;
  double plan_seconds = 0, check_seconds = 0, simulate_seconds = 0;
  StepSimulation sim;
  RingStats rings;
  // Under several setups: how they were searched, and the setup whose equal plan
  // was checked and simulated for this one (PolicySearch); empty: its own.
  SetupSearch search;
  std::string shared_with;
};

void write_trace(const std::string& path, PolicyOutcome& o) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write trace file '" + path + "'");
  sim::write_chrome_trace(out, *o.sim.graph, *o.sim.replay, o.sim.process_names);
  if (!out) throw std::runtime_error("writing trace file '" + path + "' failed");
  o.sim.graph.reset();
  o.sim.replay.reset();
  std::printf("trace    %s: %s\n", o.name.c_str(), path.c_str());
}

// One policy's plan of the batch under one setup, or why it could not place it.
struct PolicyPlan {
  StepPlan plan;
  std::string failure;  // non-empty: the planner could not place the batch
  double seconds = 0;
};

PolicyPlan plan_with(const std::string& name, const PlanSetup& setup, std::span<const int64_t> lengths) {
  PolicyPlan p;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    p.plan = plan_policy(name)(lengths, setup);
  } catch (const std::invalid_argument& e) {
    p.failure = e.what();
  }
  p.seconds = seconds_since(t0);
  return p;
}

// Checks a policy's plan and simulates the step. A policy that cannot place the
// batch is an outcome with its failure; a plan that fails check_plan is a planner
// bug (std::runtime_error).
PolicyOutcome simulate_plan(const std::string& name, const PlanRequest& r, const PlanSetup& setup,
                            std::span<const int64_t> lengths, const PolicyPlan& planned) {
  PolicyOutcome o;
  o.name = name;
  o.recompute = setup_label(setup);
  if (!planned.failure.empty()) {
    o.failure = planned.failure;
    return o;
  }
  const StepPlan& plan = planned.plan;
  o.plan_seconds = planned.seconds;
  auto t0 = std::chrono::steady_clock::now();
  try {
    if (r.check)
      check_plan(plan, lengths, setup.settings.layers_per_stage, setup.settings.pipeline_stages, setup.layout.vpp);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("the " + name + " planner produced an invalid plan: " + std::string(e.what()));
  }
  o.check_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  o.sim = simulate_step(plan, lengths, setup.costs, r.trace.has_value());
  o.simulate_seconds = seconds_since(t0);
  o.rings = ring_stats(plan, lengths);
  o.mixes = activation_mix_stats(plan);
  if (r.trace) write_trace(trace_path(*r.trace, name, r.policies.size() > 1), o);
  return o;
}

// Plans the batch with one policy, checks the plan and simulates the step.
PolicyOutcome run_policy(const std::string& name, const PlanRequest& r, const PlanSetup& setup,
                         std::span<const int64_t> lengths) {
  return simulate_plan(name, r, setup, lengths, plan_with(name, setup, lengths));
}

// The bound every policy's step is measured against.
void print_bound(const StepBound& b) {
  std::printf("bound    %.2f s per step (no plan beats it): work %.2f s per rank on average; the longest "
              "sequence through every stage on %d ranks (%s tokens each) %.2f s; its offload forced by memory %.2f s; "
              "each with the gradient sync after it\n\n",
              b.seconds(), b.work, b.ranks, grouped(static_cast<double>(b.member_tokens)).c_str(), b.longest,
              b.offload);
}

// One row per policy: step time and its multiple of the bound, throughput, speed-up
// over static, idle, MFU, traffic, spread.
void print_table(const std::vector<PolicyOutcome>& outcomes, int64_t tokens, const HardwareProfile& hw,
                 const StepBound& bound) {
  std::optional<double> static_step;
  for (const PolicyOutcome& o : outcomes)
    if (o.name == policy_name(SchedulerPolicy::Static) && o.failure.empty()) static_step = o.sim.step_seconds;
  std::printf("%-16s %-14s %9s %10s %8s %11s %8s %6s %6s %12s %9s %8s %12s\n", "policy", "recompute", "plan s",
              "step s", "of bound", "tokens/s", "speedup", "idle", "MFU", "attention GB", "micro-b.", "spread",
              "ranks/spread");
  std::printf("%-16s %-14s %9s %10s %8s %11s %8s %6s %6s %12s %9s %8s %12s\n", "", "", "", "", "", "", "vs static",
              "", "", "", "per rank", "seqs", "mean / max");
  for (const PolicyOutcome& o : outcomes) {
    if (!o.failure.empty()) {
      std::printf("%-16s does not fit: %s\n", o.name.c_str(), o.failure.c_str());
      continue;
    }
    const StepSimulation& s = o.sim;
    const double mfu = s.step_seconds > 0
                           ? hw.achievable_fraction * s.compute_seconds / (s.processes * s.step_seconds)
                           : 0;
    const std::string speedup = static_step ? fixed(*static_step / s.step_seconds, 2) + "x" : "-";
    const std::string mb = std::to_string(o.rings.min_micro_batches_per_rank) + "-" +
                           std::to_string(o.rings.max_micro_batches_per_rank);
    const std::string ranks = o.rings.spread_sequences > 0
                                  ? fixed(o.rings.mean_ranks, 1) + " / " + std::to_string(o.rings.max_ranks)
                                  : "-";
    std::printf("%-16s %-14s %9.3f %10.2f %8.2f %11s %8s %6.3f %6.3f %12.1f %9s %8lld %12s\n", o.name.c_str(),
                o.recompute.c_str(), o.plan_seconds, s.step_seconds, s.step_seconds / bound.seconds(),
                grouped(static_cast<double>(tokens) / s.step_seconds).c_str(), speedup.c_str(),
                s.idle_fraction, mfu, s.attention_bytes / 1e9, mb.c_str(),
                static_cast<long long>(o.rings.spread_sequences), ranks.c_str());
  }
  std::printf("\n");
}

// "2: 5, 3-4: 2": how many spread sequences span how many ranks (power-of-two bins).
std::string ring_histogram(const RingStats& rings) {
  std::string hist;
  for (size_t b = 1; b < rings.histogram.size(); ++b) {
    if (rings.histogram[b] == 0) continue;
    const int lo = (1 << (b - 1)) + 1, hi = 1 << b;
    hist += (hist.empty() ? "" : ", ") + (lo == hi ? std::to_string(hi) : std::to_string(lo) + "-" + std::to_string(hi)) +
            ": " + std::to_string(rings.histogram[b]);
  }
  return hist.empty() ? "none" : hist;
}

// Two lines per placed policy: where the time goes, and what planning and simulating cost.
void print_details(const std::vector<PolicyOutcome>& outcomes) {
  for (const PolicyOutcome& o : outcomes) {
    if (!o.failure.empty()) continue;
    std::printf("%-16s ranks per spread sequence {%s}; rings %lld; busy per rank %.2f-%.2f s; ring waits %.2f s "
                "per rank; gradient sync %.3f s; offloaded %.1f GB (largest micro-batch %.2f GB per GPU); pipeline "
                "%.1f GB\n",
                o.name.c_str(), ring_histogram(o.rings).c_str(), static_cast<long long>(o.rings.rings),
                o.sim.min_busy_seconds, o.sim.max_busy_seconds, o.sim.ring_wait_seconds / o.sim.processes,
                o.sim.gradient_sync_seconds,
                o.sim.offloaded_bytes / 1e9, o.sim.max_offloaded_bytes_per_gpu / 1e9, o.sim.pipeline_bytes / 1e9);
    if (o.mixes.over > 0)
      std::printf("%-16s micro-batches above C: %lld, of which %lld recompute (at most %lld of a stage's layers) and "
                  "%lld offload (ratio at most %.3f)\n",
                  "", static_cast<long long>(o.mixes.over), static_cast<long long>(o.mixes.recomputing),
                  static_cast<long long>(o.mixes.most_layers), static_cast<long long>(o.mixes.offloading),
                  o.mixes.most_ratio);
    if (o.sim.all_to_all_bytes > 0)
      std::printf("%-16s expert all-to-all %.1f GB, %.3f s per rank\n", "", o.sim.all_to_all_bytes / 1e9,
                  o.sim.all_to_all_seconds / o.sim.processes);
    if (o.shared_with.empty())
      std::printf("%-16s timing: plan %.3f s, check_plan %.3f s, simulate %.3f s (%s operations, %s dependencies)\n",
                  "", o.plan_seconds, o.check_seconds, o.simulate_seconds,
                  grouped(static_cast<double>(o.sim.operations)).c_str(),
                  grouped(static_cast<double>(o.sim.dependencies)).c_str());
    else
      std::printf("%-16s timing: plan %.3f s; the plan is %s's, checked and simulated there (%s operations, %s "
                  "dependencies)\n",
                  "", o.plan_seconds, o.shared_with.c_str(), grouped(static_cast<double>(o.sim.operations)).c_str(),
                  grouped(static_cast<double>(o.sim.dependencies)).c_str());
    const SetupSearch& q = o.search;
    if (q.simulated + q.shared + q.pruned > 1)
      std::printf("%-16s setups: %d simulated, %d with a plan equal to a simulated one, %d pruned by their bound\n", "",
                  q.simulated, q.shared, q.pruned);
  }
}

// Offload is bounded per GPU, not per node: warns when a node's GPUs together could exceed its host memory.
void warn_host_memory(const std::vector<PolicyOutcome>& outcomes, const HardwareProfile& hw) {
  for (const PolicyOutcome& o : outcomes) {
    if (!o.failure.empty() || hw.host_bytes_per_node <= 0) continue;
    const double node = o.sim.max_offloaded_bytes_per_gpu * hw.gpus_per_node;
    if (node > hw.host_bytes_per_node) {
      std::printf("warning: %s offloads up to %.0f GB per GPU in one micro-batch, %.1f TB per node if all %d GPUs of "
                  "a node do so, above the %.1f TB of host memory\n",
                  o.name.c_str(), o.sim.max_offloaded_bytes_per_gpu / 1e9, node / 1e12, hw.gpus_per_node,
                  hw.host_bytes_per_node / 1e12);
    }
  }
}

// The ep to plan with and, when several were tried, one line per candidate.
struct ExpertChoice {
  int ep = 1;
  std::string report;
};

// --ep when given, 1 for a dense model, else the candidate
// (expert_parallel_candidates) whose fastest policy simulates the shortest step
// (ties: the smaller ep; a candidate that fits beats one that does not), under
// --recompute's mode (none under auto: the mode is then chosen per policy for the
// chosen ep), without sequence parallelism (the trainer runs it for dense models
// only). The candidates run without traces.
ExpertChoice choose_expert_parallel(const PlanRequest& r, const HardwareProfile& hardware, const ModelShape& model,
                                    std::span<const int64_t> lengths) {
  if (r.ep > 0) return {static_cast<int>(r.ep), ""};
  if (model.experts == 1 || r.gpus % (r.tp * r.pp) != 0) return {1, ""};
  PlanRequest quiet = r;
  quiet.trace.reset();
  ExpertChoice choice;
  double best = std::numeric_limits<double>::infinity();
  bool fits = false;
  std::string failures;
  for (int ep : expert_parallel_candidates(model, static_cast<int>(r.gpus / (r.tp * r.pp)))) {
    std::optional<PlanSetup> setup;
    try {
      setup = make_plan_setup(hardware, model, static_cast<int>(r.gpus), static_cast<int>(r.tp),
                              static_cast<int>(r.pp), r.context, r.capacity, ep, static_cast<int>(r.vpp),
                              r.recompute.value_or(RecomputeMode::None), false);
    } catch (const PlanInputError& e) {
      choice.report += "ep       " + std::to_string(ep) + ": does not fit: " + e.what() + "\n";
      failures += (failures.empty() ? "" : "; ") + std::string(e.what());
      continue;
    }
    setup->static_cp = static_cast<int>(r.cp);
    double step = std::numeric_limits<double>::infinity();
    std::string fastest = "no policy places the batch";
    for (const std::string& name : r.policies) {
      const PolicyOutcome o = run_policy(name, quiet, *setup, lengths);
      if (o.failure.empty() && o.sim.step_seconds < step) step = o.sim.step_seconds, fastest = name;
    }
    choice.report += "ep       " + std::to_string(ep) + ": C = " +
                     grouped(static_cast<double>(setup->settings.capacity)) + " tokens; " +
                     (std::isfinite(step) ? "step " + fixed(step, 2) + " s (" + fastest + ")" : fastest) + "\n";
    if (!fits || step < best) choice.ep = ep, best = step;
    fits = true;
  }
  if (!fits) throw PlanInputError("no expert-parallel degree fits: " + failures);
  choice.report += "ep       " + std::to_string(choice.ep) + " chosen\n\n";
  return choice;
}

// The setups a run compares, in this order (ties then go to the earlier: no sequence
// parallelism, less recomputation): without sequence parallelism --recompute's mode
// alone, or under auto none, none with selective and with full layers mixed into
// offload above the capacity (PlanSetup::mixed), selective and full; then, under
// --sequence-parallel on or (where the trainer runs it: tp above 1, a dense model)
// auto, the same modes with sequence parallelism but without the mixed ones, as it
// excludes offload (the trainer refuses offload under it: its offload moves the same
// rows of every saved tensor, which sequence parallelism shards). A setup whose
// memory cannot hold the model is left out, unless it is the only one asked for.
std::vector<PlanSetup> candidate_setups(const PlanRequest& r, const HardwareProfile& hardware, const ModelShape& model,
                                        int ep) {
  struct Candidate {
    RecomputeMode mode, mixed;  // every layer's, and mixed into offload
    bool sequence_parallel;
  };
  constexpr RecomputeMode none = RecomputeMode::None, selective = RecomputeMode::Selective, full = RecomputeMode::Full;
  const std::vector<std::pair<RecomputeMode, RecomputeMode>> modes =
      r.recompute ? std::vector<std::pair<RecomputeMode, RecomputeMode>>{{*r.recompute, none}}
                  : std::vector<std::pair<RecomputeMode, RecomputeMode>>{
                        {none, none}, {none, selective}, {none, full}, {selective, none}, {full, none}};
  std::vector<bool> sequence_parallel = {false};
  if (r.sequence_parallel) {
    sequence_parallel = {*r.sequence_parallel};
  } else if (!sequence_parallel_issue(model, static_cast<int>(r.tp))) {
    sequence_parallel = {false, true};
  }
  std::vector<Candidate> candidates;
  for (const bool sp : sequence_parallel)
    for (const auto& [mode, mixed] : modes)
      if (!sp || mixed == none) candidates.push_back({mode, mixed, sp});
  std::vector<PlanSetup> setups;
  std::string failures;
  for (const Candidate& c : candidates) {
    try {
      setups.push_back(make_plan_setup(hardware, model, static_cast<int>(r.gpus), static_cast<int>(r.tp),
                                       static_cast<int>(r.pp), r.context, r.capacity, ep, static_cast<int>(r.vpp),
                                       c.mode, c.sequence_parallel, c.mixed));
    } catch (const PlanInputError& e) {
      if (candidates.size() == 1) throw;
      failures += (failures.empty() ? "" : "; ") + std::string(enum_name(kRecomputeModeNames, c.mode)) +
                  (c.sequence_parallel ? "+sp" : "") + ": " + e.what();
      continue;
    }
    setups.back().static_cp = static_cast<int>(r.cp);
  }
  if (setups.empty()) throw PlanInputError("no recompute setup fits: " + failures);
  return setups;
}

// Whether two setups' StepCosts can differ only in `recomputed`: make_plan_setup
// derives every other cost from the recompute mode and sequence parallelism alone,
// and the mixed mode's model is `recomputed`, which the simulator reads for a
// micro-batch that recomputes layers only (StepCosts::recomputed).
bool same_costs_but_mixed(const PlanSetup& a, const PlanSetup& b) {
  return a.recompute == b.recompute && a.sequence_parallel == b.sequence_parallel;
}

// Whether a policy's plan ignores the mixed mode: plan_static reads the ranks, the
// capacity and cp alone, so setups of the same costs but the mixed mode get one plan.
bool plans_blind_to_mixed_mode(const std::string& policy) { return policy == policy_name(SchedulerPolicy::Static); }

bool recomputes_layers(const StepPlan& plan) {
  for (const auto& rank : plan.ranks)
    for (const PlannedMicroBatch& mb : rank)
      if (mb.recompute_layers > 0) return true;
  return false;
}

// A relative margin on the bound for rounding: the bound and the simulated step add
// the same times in different orders, so a step equal to its bound may come out a
// few ulps below it. A setup is pruned only when its bound exceeds the best step by
// more, so no setup that could win or tie is skipped.
constexpr double kBoundRounding = 1e-9;

// One policy's search of the setups (search_all), which threads fill in.
//
// The search it gives is sequential: the setups in ascending order of their bound
// (simulated_step_bound; exhaustive: as given); a setup whose bound exceeds the
// shortest step of those before it is pruned, since its own step is at least its
// bound; a setup whose plan equals a plan simulated before it under the same costs,
// the mixed mode aside, with no micro-batch recomputing layers, takes that outcome
// (the same check, the same simulation). A policy blind to the mixed mode
// (plans_blind_to_mixed_mode) takes it without planning. Neither changes the winner: a pruned
// setup's step exceeds it, and a shared outcome is what its simulation would give.
// The threads run a policy's setups side by side, each skipping what is pruned
// already given the setups before it that have finished (what the sequential
// search prunes too, as the steps before can only lower the best), and finish()
// then decides from the results in order, so the outcome, the counts and the
// first error do not depend on the scheduling.
struct PolicySearch {
  std::string name;
  bool exhaustive = false;
  std::vector<double> bounds;                  // by setup
  std::vector<size_t> order;                   // setups in search order
  std::vector<std::optional<PolicyOutcome>> outcomes;  // by position in order
  std::vector<std::optional<StepPlan>> plans;  // placed plans, by position (not exhaustive)
  std::vector<std::optional<size_t>> taken_from;  // by position: whose outcome a mixed-blind policy took
  std::vector<std::exception_ptr> errors;      // by position
  std::vector<bool> done;                      // by position

  PolicySearch(std::string policy, std::span<const PlanSetup> setups, std::span<const int64_t> lengths,
               bool exhaustive_search)
      : name(std::move(policy)), exhaustive(exhaustive_search), bounds(setups.size()), order(setups.size()),
        outcomes(setups.size()), plans(setups.size()), taken_from(setups.size()), errors(setups.size()), done(setups.size()) {
    for (size_t i = 0; i < setups.size(); ++i) {
      bounds[i] = simulated_step_bound(setups[i], lengths).seconds();
      order[i] = i;
    }
    if (!exhaustive)
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return bounds[x] < bounds[y]; });
  }

  bool pruned(size_t position, double best) const {
    return !exhaustive && bounds[order[position]] * (1 - kBoundRounding) > best;
  }

  // The setup at `position` unless what has finished before it prunes it; `lock`
  // guards this search's state (run outside it: planning, checking, simulating).
  void run(size_t position, const PlanRequest& quiet, std::span<const PlanSetup> setups,
           std::span<const int64_t> lengths, std::mutex& lock) {
    const PlanSetup& setup = setups[order[position]];
    try {
      {
        const std::lock_guard<std::mutex> guard(lock);
        double best = std::numeric_limits<double>::infinity();
        for (size_t j = 0; j < position; ++j)
          if (done[j] && outcomes[j] && outcomes[j]->failure.empty()) best = std::min(best, outcomes[j]->sim.step_seconds);
        if (pruned(position, best)) return;
        if (!exhaustive && plans_blind_to_mixed_mode(name))
          for (size_t j = 0; j < position; ++j)
            if (done[j] && outcomes[j] && !taken_from[j] && same_costs_but_mixed(setups[order[j]], setup)) {
              outcomes[position] = outcomes[j];
              outcomes[position]->recompute = setup_label(setup);
              outcomes[position]->check_seconds = outcomes[position]->simulate_seconds = 0;
              taken_from[position] = j;
              done[position] = true;
              return;
            }
      }
      PolicyPlan planned = plan_with(name, setup, lengths);
      std::optional<PolicyOutcome> outcome;
      // Kept for sharing only where another setup has the same costs but the mixed mode.
      const bool shareable =
          !exhaustive && planned.failure.empty() && !plans_blind_to_mixed_mode(name) &&
          std::count_if(setups.begin(), setups.end(), [&](const PlanSetup& x) { return same_costs_but_mixed(x, setup); }) > 1 &&
          !recomputes_layers(planned.plan);
      if (shareable) {
        const std::lock_guard<std::mutex> guard(lock);
        for (size_t j = 0; j < position && !outcome; ++j)
          if (done[j] && plans[j] && same_costs_but_mixed(setups[order[j]], setup) && *plans[j] == planned.plan) {
            outcome = *outcomes[j];
            outcome->recompute = setup_label(setup);
            outcome->plan_seconds = planned.seconds;
            outcome->check_seconds = outcome->simulate_seconds = 0;
          }
      }
      if (!outcome) outcome = simulate_plan(name, quiet, setup, lengths, planned);
      const std::lock_guard<std::mutex> guard(lock);
      outcomes[position] = std::move(outcome);
      if (shareable) plans[position] = std::move(planned.plan);
      done[position] = true;
    } catch (...) {
      const std::lock_guard<std::mutex> guard(lock);
      errors[position] = std::current_exception();
      done[position] = true;
    }
  }

  // The sequential search's outcome from the results: the shortest step wins (ties:
  // the first setup as given); when none places the batch, the last setup's failure
  // (the least memory per token). Rethrows the first error the sequential search meets.
  PolicyOutcome finish(std::span<const PlanSetup> setups) {
    SetupSearch search;
    double best = std::numeric_limits<double>::infinity();
    std::vector<std::optional<PolicyOutcome>> by_setup(setups.size());
    std::vector<size_t> simulated;  // positions
    for (size_t position = 0; position < order.size(); ++position) {
      if (pruned(position, best)) {
        ++search.pruned;
        continue;
      }
      if (errors[position]) std::rethrow_exception(errors[position]);
      if (!outcomes[position]) throw std::logic_error("plan: setup " + std::to_string(position) + " of " + name +
                                                      " was skipped but is not pruned");
      PolicyOutcome& o = *outcomes[position];
      const PlanSetup& setup = setups[order[position]];
      std::optional<size_t> same;
      if (taken_from[position] && std::find(simulated.begin(), simulated.end(), *taken_from[position]) != simulated.end())
        same = taken_from[position];
      if (plans[position])
        for (const size_t j : simulated)
          if (!same && plans[j] && same_costs_but_mixed(setups[order[j]], setup) && *plans[j] == *plans[position])
            same = j;
      if (same) {
        o.shared_with = setup_label(setups[order[*same]]);
        ++search.shared;
      } else {
        simulated.push_back(position);
        ++search.simulated;
      }
      if (o.failure.empty()) best = std::min(best, o.sim.step_seconds);
      by_setup[order[position]] = std::move(o);
    }
    // In the setups' order: a placed step replaces a failure or a slower step; a failure only a failure.
    std::optional<size_t> chosen;
    for (size_t i = 0; i < by_setup.size(); ++i) {
      if (!by_setup[i]) continue;
      const PolicyOutcome& o = *by_setup[i];
      const PolicyOutcome* kept = chosen ? &*by_setup[*chosen] : nullptr;
      if (!kept || !kept->failure.empty() || (o.failure.empty() && o.sim.step_seconds < kept->sim.step_seconds))
        chosen = i;
    }
    PolicyOutcome o = std::move(*by_setup[*chosen]);
    search.chosen = *chosen;
    search.placed = o.failure.empty();
    search.step_seconds = search.placed ? o.sim.step_seconds : 0;
    o.search = search;
    return o;
  }
};

// f(i) for every i below n on up to hardware_concurrency threads (the caller's
// among them), taking the i in order.
template <class F>
void run_on_threads(size_t n, const F& f) {
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i; (i = next++) < n;) f(i);
  };
  const size_t threads = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

// Each policy searched over the setups (PolicySearch) by tasks on threads. Never traced.
std::vector<PolicyOutcome> search_all(const PlanRequest& r, std::span<const std::string> policies,
                                      std::span<const PlanSetup> setups, std::span<const int64_t> lengths,
                                      bool exhaustive) {
  PlanRequest quiet = r;
  quiet.trace.reset();
  std::vector<PolicySearch> searches;
  // With one pipeline stage balance-deep is balance (deeper warm-ups need stages to
  // run ahead in): where both are asked for it takes balance's outcome instead of
  // repeating the search.
  const std::string balance = policy_name(SchedulerPolicy::Balance), deep = "balance-deep";
  const bool deep_is_balance = !setups.empty() && setups.front().layout.pp == 1 &&
                               std::find(policies.begin(), policies.end(), balance) != policies.end();
  for (const std::string& name : policies)
    if (!(deep_is_balance && name == deep)) searches.emplace_back(name, setups, lengths, exhaustive);
  // A task: one policy's setups of the same costs but the mixed mode (same_costs_but_mixed),
  // in search order, one after another, so that a later one finds an equal plan of an
  // earlier one finished; the policies' first tasks before their second.
  struct Task {
    size_t search;
    std::vector<size_t> positions;
  };
  std::vector<std::vector<Task>> by_policy(searches.size());
  for (size_t k = 0; k < searches.size(); ++k) {
    const PolicySearch& search = searches[k];
    for (size_t position = 0; position < search.order.size(); ++position) {
      const PlanSetup& setup = setups[search.order[position]];
      auto same = std::find_if(by_policy[k].begin(), by_policy[k].end(), [&](const Task& t) {
        return same_costs_but_mixed(setups[search.order[t.positions.front()]], setup);
      });
      if (same == by_policy[k].end()) same = by_policy[k].insert(by_policy[k].end(), Task{k, {}});
      same->positions.push_back(position);
    }
  }
  std::vector<Task> tasks;
  for (size_t round = 0; round < setups.size(); ++round)
    for (const std::vector<Task>& policy_tasks : by_policy)
      if (round < policy_tasks.size()) tasks.push_back(policy_tasks[round]);
  std::mutex lock;
  run_on_threads(tasks.size(), [&](size_t t) {
    for (const size_t position : tasks[t].positions) searches[tasks[t].search].run(position, quiet, setups, lengths, lock);
  });
  std::vector<PolicyOutcome> searched;
  for (PolicySearch& s : searches) searched.push_back(s.finish(setups));
  std::vector<PolicyOutcome> outcomes;
  for (const std::string& name : policies) {
    const std::string& source = deep_is_balance && name == deep ? balance : name;
    outcomes.push_back(*std::find_if(searched.begin(), searched.end(),
                                     [&](const PolicyOutcome& o) { return o.name == source; }));
    outcomes.back().name = name;
  }
  return outcomes;
}

// Every policy of the request searched over the setups (search_all); with --trace
// each winner is then planned and simulated again, in the policies' order, to write
// its trace.
std::vector<PolicyOutcome> search_policies(const PlanRequest& r, std::span<const PlanSetup> setups,
                                           std::span<const int64_t> lengths) {
  std::vector<PolicyOutcome> outcomes = search_all(r, r.policies, setups, lengths, false);
  if (r.trace)
    for (PolicyOutcome& o : outcomes)
      if (o.failure.empty()) {
        const SetupSearch search = o.search;
        o = run_policy(o.name, r, setups[search.chosen], lengths);
        o.search = search;
      }
  return outcomes;
}

// With several setups: each one's capacity (the mixed ones have none's).
void print_setups(const std::vector<PlanSetup>& setups) {
  if (setups.size() < 2) return;
  std::string capacities;
  bool mixes = false, sequence_parallel = false, offloads = false;
  for (const PlanSetup& s : setups) {
    mixes = mixes || s.mixed != RecomputeMode::None;
    offloads = offloads || s.settings.offload.enabled;
    sequence_parallel = sequence_parallel || s.sequence_parallel;
    if (s.mixed != RecomputeMode::None) continue;
    const ModelCosts costs = model_costs(s.model, s.layout.tp, s.layout.pp, s.recompute, s.sequence_parallel);
    capacities += std::string(capacities.empty() ? "" : ", ") + setup_label(s) + " " +
                  grouped(static_cast<double>(s.settings.capacity)) + " (" +
                  fixed(costs.saved_bytes_per_token / 1e3, 1) + " KB per token and layer)";
  }
  std::printf("setups   per policy the shortest simulated step of: C = %s tokens%s%s%s\n\n", capacities.c_str(),
              offloads ? "; offload only under none" : "",
              mixes ? ", which may also recompute (none+selective, none+full) some layers of a micro-batch above C" : "",
              sequence_parallel ? "; +sp: sequence parallelism, without offload" : "");
}

// The pipeline degrees --pp auto tries: every pp whose tp x pp divides the GPUs and
// that leaves each stage a layer.
std::vector<int> pipeline_candidates(const PlanRequest& r, const ModelShape& model) {
  std::vector<int> out;
  for (int64_t pp = 1; pp <= model.layers && r.tp * pp <= r.gpus; ++pp)
    if (r.gpus % (r.tp * pp) == 0) out.push_back(static_cast<int>(pp));
  return out;
}

// The pp to plan with under --pp auto, and one line per candidate: the one whose
// fastest policy simulates the shortest step over its setups (ties: the smaller pp),
// each planned as the request asks (its ep chosen as choose_expert_parallel does, every
// recompute setup searched), without traces. A layout the model does not fit is
// reported and skipped; none fitting is a PlanInputError naming why.
struct PipelineChoice {
  int pp = 1;
  std::string report;
};

PipelineChoice choose_pipeline_stages(const PlanRequest& r, const HardwareProfile& hardware, const ModelShape& model,
                                      std::span<const int64_t> lengths) {
  PipelineChoice choice;
  double best = std::numeric_limits<double>::infinity();
  std::string failures;
  for (const int pp : pipeline_candidates(r, model)) {
    PlanRequest q = r;
    q.trace.reset();
    q.pp = pp;
    const std::string label = "pp       " + std::to_string(pp) + " (hdp " + std::to_string(r.gpus / (r.tp * pp)) + ")";
    try {
      const ExpertChoice experts = choose_expert_parallel(q, hardware, model, lengths);
      const std::vector<PlanSetup> setups = candidate_setups(q, hardware, model, experts.ep);
      double step = std::numeric_limits<double>::infinity();
      std::string fastest, failure;
      for (const PolicyOutcome& o : search_all(q, q.policies, setups, lengths, false)) {
        if (!o.failure.empty() && failure.empty()) failure = o.name + ": " + o.failure;
        if (o.failure.empty() && o.sim.step_seconds < step)
          step = o.sim.step_seconds, fastest = o.name + ", " + setup_label(setups[o.search.chosen]);
      }
      if (!std::isfinite(step)) throw PlanInputError(failure);
      choice.report += label + ": step " + fixed(step, 2) + " s (" + fastest + ")\n";
      if (step < best) choice.pp = pp, best = step;
    } catch (const PlanInputError& e) {
      choice.report += label + ": does not fit: " + e.what() + "\n";
      failures += (failures.empty() ? "" : "; ") + std::string("pp ") + std::to_string(pp) + ": " + e.what();
    }
  }
  if (!std::isfinite(best)) throw PlanInputError("no pipeline degree places the batch: " + failures);
  choice.report += "pp       " + std::to_string(choice.pp) + " chosen\n\n";
  return choice;
}

StepBound least_bound(const std::vector<PlanSetup>& setups, std::span<const int64_t> lengths) {
  std::optional<StepBound> least;
  for (const PlanSetup& s : setups) {
    const StepBound b = simulated_step_bound(s, lengths);
    if (!least || b.seconds() < least->seconds()) least = b;
  }
  return *least;
}

}  // namespace

SetupSearch search_setups(const std::string& policy, std::span<const PlanSetup> setups,
                          std::span<const int64_t> lengths, bool exhaustive) {
  if (setups.empty()) throw std::invalid_argument("search_setups needs a setup");
  PlanRequest r;
  r.policies = {policy};
  return search_all(r, r.policies, setups, lengths, exhaustive).front().search;
}

int command_plan(const std::vector<std::string>& raw) {
#ifdef __GLIBC__
  // The plans of thousands of GPUs are large (a static plan at 12,288 GPUs holds
  // millions of ring pieces) and each setup's is freed before the next: grow the heap
  // in large steps and keep what is freed, instead of faulting in fresh zeroed pages
  // for every setup (LLaMA-70B at 12,288 GPUs, 2M: 1.10 -> 0.95 s; docs/performance.md).
  mallopt(M_TOP_PAD, 256 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
  Arguments args(raw);
  if (args.wants_help()) {
    std::fputs(kPlanHelp, stdout);
    return kExitSuccess;
  }
  return run_subcommand("plan", [&] {
    refuse_bare_sequence_parallel(raw);
    PlanRequest request = read_plan_request(args);
    const HardwareProfile hardware = load_cluster_file(request.cluster_path);
    const ModelShape model = load_model_file(request.model_path);
    if (request.sequence_parallel.value_or(false))
      if (const std::optional<std::string> issue = sequence_parallel_issue(model, static_cast<int>(request.tp)))
        throw PlanInputError("--sequence-parallel on: " + *issue);
    const PlanBatch batch = draw_batch(request);
    PipelineChoice pipeline;
    if (request.pp == 0) {
      pipeline = choose_pipeline_stages(request, hardware, model, batch.lengths);
      request.pp = pipeline.pp;
    }
    const ExpertChoice experts = choose_expert_parallel(request, hardware, model, batch.lengths);
    const std::vector<PlanSetup> setups = candidate_setups(request, hardware, model, experts.ep);
    const PlanSetup& setup = setups.front();
    print_model_and_cluster(request, setup);
    print_batch(request, batch);
    std::fputs(pipeline.report.c_str(), stdout);
    std::fputs(experts.report.c_str(), stdout);
    print_setups(setups);
    const std::vector<PolicyOutcome> outcomes = search_policies(request, setups, batch.lengths);
    if (request.trace) std::printf("\n");
    const StepBound bound = least_bound(setups, batch.lengths);
    print_bound(bound);
    print_table(outcomes, batch.tokens, setup.hardware, bound);
    print_details(outcomes);
    warn_host_memory(outcomes, setup.hardware);
    const bool placed =
        std::any_of(outcomes.begin(), outcomes.end(), [](const PolicyOutcome& o) { return o.failure.empty(); });
    if (!placed) throw PlanInputError("no policy could place the batch on " + std::to_string(request.gpus) + " GPUs");
    return kExitSuccess;
  });
}

}  // namespace hdp
