#pragma once
// `trainer plan`: plans one global batch with several policies (static, naive,
// balance; planning/hdp_planner.h) for a described cluster and model, simulates
// the training step of each plan (whatif/step_simulation.h; under --recompute
// auto once per recompute setup, with tp above 1 also with sequence parallelism,
// keeping the fastest) and prints the setup, step
// time and its multiple of the lower bound no plan beats (planning/step_bound.h),
// tokens/s, idle fraction, attention traffic, ring sizes and the speed-up over
// static. docs/planning.md describes it.

#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/errors.h"
#include "whatif/hardware.h"
#include "planning/hdp_planner.h"
#include "planning/plan.h"
#include "planning/step_bound.h"
#include "whatif/step_simulation.h"

namespace hdp {

// A layout the model or the cluster does not allow, or an unknown policy. (A bad
// cluster or model file is a ConfigError naming file:line and key.) Exit code 2.
class PlanInputError : public InputError {
 public:
  using InputError::InputError;
};

// configs/cluster/*.yaml: gpus_per_node, peak_bf16_flops, achievable_fraction,
// hbm_bytes, hbm_bytes_per_s, reserved_bytes, nvlink_bytes_per_s,
// internode_bytes_per_s, intranode_latency_s, internode_latency_s,
// pcie_bytes_per_s, and optionally name, host_bytes_per_node, link_efficiency,
// gemm_half_rows, attention_half_rows (whatif/hardware.h). Both loaders throw
// ConfigError naming file:line and the key that is missing, unknown, mistyped or
// out of range.
HardwareProfile load_cluster_file(const std::string& path);

// configs/models/*.yaml, read as the training config's model section
// (read_model_file, config/model_file.h: the same keys, rules and errors), as the
// shape the planner counts with (ModelConfig::shape), named by the file's `name`.
ModelShape load_model_file(const std::string& path);

// The sequences of one global batch from `source`: a built-in distribution name
// (data/length_distributions.h), an HDF5 token dataset, or a text file of
// document lengths (one per line, taken in order). Documents longer than the
// context are cut into context-sized pieces. `description` (if given) receives
// a one-line account of the source.
std::vector<int64_t> global_batch_lengths(const std::string& source, int64_t context, int64_t global_batch_tokens,
                                          uint64_t seed, std::string* description = nullptr);

// Everything the planners and the simulator need for one cluster, model and layout.
struct PlanSetup {
  HardwareProfile hardware;
  ModelShape model;
  ParallelDegrees layout;
  std::vector<int64_t> stage_layers;
  MemoryBudget memory;      // the derived capacity and its terms
  StepCosts costs;
  PlannerSettings settings;  // capacity = --capacity or memory.capacity
  BalanceSettings balance;   // DataParallel with one stage, Pipeline with several
  int static_cp = 0;         // 0: the smallest that fits the longest sequence
  int ep = 1;                // expert parallelism (whatif/step_simulation.h); 1 for a dense model
  // What every layer keeps and reruns (spec/model_shape.h); offload is off unless
  // None, as the trainer never offloads a recomputed layer (model/activations.h).
  RecomputeMode recompute = RecomputeMode::None;
  // With recompute None: the mode in which a micro-batch above the capacity may
  // recompute some of its stage's layers instead of offloading them
  // (planning/activation_mix.h; PlannerSettings::recompute, StepCosts::recomputed).
  // None: offload alone.
  RecomputeMode mixed = RecomputeMode::None;
  // Sequence parallelism over tp (parallel.sequence_parallel): the norms' and
  // residual stream's saved tensors, and the stage boundaries' sends, for 1/tp of the
  // tokens; no offload (and so no mixed) with it, as the trainer refuses offload under it.
  bool sequence_parallel = false;
};
// context: the longest sequence (the stage split counts attention at it, as the
// trainer does at data.max_seq_len). vpp > 1: interleaved 1F1B with vpp model chunks per
// stage (planning/pipeline_schedule.h); stage_layers are then each stage's chunks together. Throws PlanInputError if gpus is not a
// multiple of tp x pp, or the model does not allow the layout or ep
// (validate_expert_parallel) or does not fit the GPUs' memory, or sequence_parallel
// where the trainer refuses it (tp 1, a mixture of experts) or with mixed. The planners' cost
// model adds the layer's expert all-to-alls per token (all_to_all_seconds_per_token)
// to the linear term: they block the layer as compute does; its ep couples the
// predicted times of an ep group's ranks (PlannerSettings::ep). mixed (with
// recompute None and vpp 1 only, else a PlanInputError): PlanSetup::mixed, any of
// the stage's layers.
PlanSetup make_plan_setup(const HardwareProfile& hardware, const ModelShape& model, int gpus, int tp, int pp,
                          int64_t context, int64_t capacity = 0, int ep = 1, int vpp = 1,
                          RecomputeMode recompute = RecomputeMode::None, bool sequence_parallel = false,
                          RecomputeMode mixed = RecomputeMode::None);

// The planners by name: the training policies (static, naive, balance; their
// names as scheduler.policy spells them) and ablations; a new policy is one entry.
using Planner = std::function<StepPlan(std::span<const int64_t> lengths, const PlanSetup& setup)>;
const std::vector<std::pair<std::string, Planner>>& plan_policies();
// Throws PlanInputError for an unknown name.
const Planner& plan_policy(const std::string& name);

// How `trainer plan` searched one policy's setups (each a recompute mode, a mix and
// sequence parallelism on one layout) for the shortest simulated step.
struct SetupSearch {
  size_t chosen = 0;  // the setup of the shortest step (ties: the first); none placed: the last
  bool placed = false;
  double step_seconds = 0;  // the chosen setup's simulated step, if placed
  int simulated = 0;  // planned, checked and simulated
  // Planned; the plan equals one simulated under the same costs but the mixed mode's,
  // and no micro-batch of it recomputes layers, so it takes that one's outcome.
  int shared = 0;
  // Not planned: its simulated_step_bound exceeds a step already simulated.
  int pruned = 0;
};
// The setups in ascending order of their bound, pruned and shared as above (the
// result is the exhaustive search's), or, exhaustive, each planned, checked and
// simulated in order. Throws PlanInputError for an unknown policy, std::runtime_error
// for a plan that fails check_plan.
SetupSearch search_setups(const std::string& policy, std::span<const PlanSetup> setups,
                          std::span<const int64_t> lengths, bool exhaustive = false);

// The step time no plan of these sequences beats on the setup's cluster and layout
// (planning/step_bound.h), each stage's gradient synchronisation (gradient_sync) as
// its tail: every simulated step of a plan that passes check_plan is at least this.
StepBound simulated_step_bound(const PlanSetup& setup, std::span<const int64_t> lengths);

}  // namespace hdp
