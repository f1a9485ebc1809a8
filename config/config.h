#pragma once
// The training configuration: one YAML file, sections model / data / optim /
// train / parallel / scheduler / offload / loader / trace, overridable with --set
// key.path=value. Parsing is strict: unknown keys, wrong types and impossible
// values are ConfigErrors that name the key, where it came from (file:line or
// --set) and what would be valid. The keys, their docs and their own rules are the
// schema's (config/schema.h); the rules between keys are config/checks.h's.

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/enum_names.h"
#include "base/errors.h"
#include "data/dataset.h"
#include "kernels/attention_impl.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "spec/model_config.h"
#include "spec/model_shape.h"
#include "spec/optim_config.h"
#include "spec/parallel_degrees.h"

namespace hdp {

// The modes and policies of the config, each with the one table of the names
// users write for its values and what they mean (parsing, Config::yaml and the
// messages that list the choices use it).

// train.resume
enum class ResumeMode { Auto, Never };
inline constexpr EnumName<ResumeMode> kResumeModeNames[] = {
    {ResumeMode::Auto, "auto", "continue from the newest checkpoint in checkpoint_dir, if any"},
    {ResumeMode::Never, "never"}};

// scheduler.policy: naive is ByteScale's Algorithm 1, balance its Algorithm 2.
enum class SchedulerPolicy { Naive, Balance, Static };
inline constexpr EnumName<SchedulerPolicy> kSchedulerPolicyNames[] = {
    {SchedulerPolicy::Naive, "naive", "hybrid data parallelism: a sequence spans only the ranks it needs"},
    {SchedulerPolicy::Balance, "balance", "hybrid data parallelism with the balance scheduler"},
    {SchedulerPolicy::Static, "static", "a fixed dp x cp grid that splits every sequence, the baseline"}};
inline const char* policy_name(SchedulerPolicy policy) { return enum_name(kSchedulerPolicyNames, policy); }

// scheduler.balance: what the balance policy evens out.
enum class SchedulerBalance { Auto, DataParallel, Pipeline };
inline constexpr EnumName<SchedulerBalance> kSchedulerBalanceNames[] = {
    {SchedulerBalance::DataParallel, "dp", "ranks run micro-batches of similar cost at each time step"},
    {SchedulerBalance::Pipeline, "pp", "each pipeline runs similar micro-batches back to back"},
    {SchedulerBalance::Auto, "auto", "dp without pipeline parallelism, pp with it"}};

// loader.mode
// What the tp, pp and hdp groups move tensors with (parallel/process_groups.h): NCCL
// (device buffers directly; CUDA builds with NCCL) or MPI (device buffers through
// page-locked host staging); auto picks NCCL when train.device is cuda and NCCL was built.
enum class CommMode { Auto, Nccl, Mpi };
inline constexpr EnumName<CommMode> kCommModeNames[] = {
    {CommMode::Auto, "auto", "nccl when train.device is cuda and this build has NCCL, else mpi"},
    {CommMode::Nccl, "nccl", "NCCL on the GPUs (train.device: cuda, one GPU per rank)"},
    {CommMode::Mpi, "mpi", "MPI, device buffers staged through host memory"}};

enum class LoaderMode { Local, Remote };
inline constexpr EnumName<LoaderMode> kLoaderModeNames[] = {
    {LoaderMode::Local, "local", "every training rank reads its own data"},
    {LoaderMode::Remote, "remote", "loader ranks read, one plans, the training ranks fetch their pieces"}};

struct DataConfig {
  std::string path;                      // HDF5 token dataset (docs/dataset-format.md)
  std::string format = "hdf5";           // hdf5, or megatron (path = PREFIX of PREFIX.bin + PREFIX.idx)
  int64_t max_seq_len = 1024;            // longer documents are split into pieces of at most this
  int64_t global_batch_tokens = 4096;    // tokens per optimizer step (batches never exceed it)
  int64_t micro_batch_tokens = 4096;     // capacity of one micro-batch per rank; longer sequences span ranks
  bool shuffle = true;
  uint64_t seed = 1234;
};

// train.threads: OpenMP threads per rank. Above a few per core they only contend (and
// libgomp fails outright at tens of thousands), so a rank takes at most
// kThreadsPerCore per core it may run on (run/job.cpp) and never more than
// kMaxThreadsPerRank.
inline constexpr int64_t kMaxThreadsPerRank = 1024;
inline constexpr int64_t kThreadsPerCore = 4;

struct TrainConfig {
  int64_t steps = 100;
  uint64_t seed = 42;
  int64_t log_every = 10;
  std::string run_dir = "runs/default";
  int64_t checkpoint_every = 0;          // 0 disables
  std::string checkpoint_dir;            // empty: RUN_DIR/checkpoints (resolved_checkpoint_dir)
  int64_t keep_checkpoints = 3;          // newest K complete checkpoints are kept (and the newest confirmed one)
  bool async_checkpoints = true;          // write checkpoints in a background thread from a host snapshot
  double checkpoint_budget = 0.02;       // the share of the run's time checkpoints may cost (run/training_loop.h);
                                         // 0: every due checkpoint, waiting for the write in flight
  bool reuse_checkpoint_dir = false;      // accept a checkpoint_dir holding another run's checkpoints
  ResumeMode resume = ResumeMode::Auto;
  bool allow_schedule_change = false;    // resume although the learning rate would jump (run/job.cpp)
  bool start_over = false;               // with resume: never, discard a previous run's checkpoints and metrics
  std::string init_from;                 // checkpoint file whose weights start training
  bool allow_model_change = false;       // init_from although its model's numerics keys differ (run/job.cpp)
  double peak_flops = 0;                 // FLOP/s for MFU; 0 = measure with a GEMM probe
  int64_t threads = 0;                   // OpenMP/BLAS threads per rank; 0 = cores / ranks on the node
  Device device = Device::CPU;           // cpu | cuda (the local rank's GPU); guarded: tests only
  bool tf32 = false;                     // cuda: fp32 GEMMs on TF32 tensor cores
  AttentionImpl attention = AttentionImpl::Auto;  // cuda: our attention kernels or cuDNN's (kernels/attention_impl.h)
  RecomputeMode recompute = RecomputeMode::None;  // none | selective | full (spec/model_shape.h)
  std::optional<int64_t> recompute_layers;  // layers of each stage that recompute, from its first; null: all
  bool recompute_per_micro_batch = false;   // recompute_layers is the most; the step planner chooses per micro-batch
  DType precision = DType::F32;          // fp32 | bf16 (mixed precision: bf16 compute weights and activations,
                                         // fp32 master weights, gradients and moments; docs/configuration.md)
  double spike_factor = 3;               // skip a step whose loss exceeds this x the recent median; 0 = off
  double grad_norm_spike_factor = 100;   // skip a step whose gradient norm exceeds this x the recent median; 0 = off
  int64_t max_bad_steps = 3;             // this many bad (NaN/Inf or spike) steps in a row roll the run back to the
                                         // newest confirmed checkpoint before them and skip their batches;
                                         // with none to return to the run stops
  double hang_timeout_s = 600;           // no progress (or a silent peer) this long is a hang: stacks, summary, exit 1; 0 = off
};

// tp, pp, hdp: the tensor-parallel degree, pipeline stages and hybrid-data-parallel
// degree (spec/parallel_degrees.h; world = tp x pp x hdp).
struct ParallelConfig : ParallelDegrees {
  bool hdp_auto = false;                 // hdp: auto, not yet decided by the job's size (load_config)
  std::vector<int64_t> pp_layers;        // layers per stage; empty = balanced by cost
  int64_t bucket_mb = 25;                // ZeRO-1 gradient bucket size
  CommMode comm = CommMode::Auto;        // the groups' transport; resolved by choose_comm_backend (run/job.cpp)
  bool sequence_parallel = false;        // norms and residual adds on 1/tp of the sequence (model/decoder_blocks.h)
};

// How a step's sequences are spread over the hybrid-data-parallel ranks.
struct SchedulerConfig {
  SchedulerPolicy policy = SchedulerPolicy::Naive;
  SchedulerBalance balance = SchedulerBalance::Auto;  // what the balance policy evens out
  double threshold = 0.05;               // balance: ranks more than this fraction below the busiest get work
  int64_t cp = 0;                        // static: context-parallel degree; 0 = smallest divisor of hdp that fits
  std::string cost_file;                 // cost model YAML from `trainer profile`; empty = derived from FLOPs;
                                         // "profile" = measured at start-up
};

// The op tracer (docs/tracing.md): every rank records each op of `steps`
// consecutive steps out of every `every` (steps 1 .. steps, every + 1 ..), one
// JSONL file per rank under `dir` (empty: RUN_DIR/trace). every = 0: off.
struct TraceConfig {
  int64_t every = 0;
  int64_t steps = 1;
  std::string dir;
};

// Where the step metrics go besides RUN_DIR/metrics.jsonl.
struct MetricsConfig {
  bool tensorboard = false;  // TensorBoard event files in RUN_DIR/tensorboard (run/tensorboard.h)
};

// Where the training ranks' data comes from.
struct LoaderConfig {
  LoaderMode mode = LoaderMode::Local;
  int64_t servers = 1;                   // remote: loader server ranks added beside the training ranks
  double timeout_s = 60;                 // remote: a server silent this long ends the job
};

// Selective activation offload of long sequences' micro-batches.
struct OffloadConfig {
  bool enabled = true;
  double ratio = -1;                     // forced ratio in [0, 1]; negative = chosen by the cost model
  double bandwidth_gbs = 10;             // host<->device copy bandwidth the cost model assumes
};

struct Config {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  ParallelConfig parallel;
  SchedulerConfig scheduler;
  OffloadConfig offload;
  LoaderConfig loader;
  TraceConfig trace;
  MetricsConfig metrics;
  std::string source;                    // file the config was read from
  std::string yaml;                      // the effective config as YAML (overrides applied)
  // Where each explicitly set key came from, by key path ("model.num_heads"):
  // "<file>:<line>" or "--set model.num_heads=6"; sections present in the file
  // map their name ("model") to the header's "<file>:<line>". Keys left at
  // their default are absent. Used to point error messages at the right place.
  std::map<std::string, std::string> origins;
};

// Reads `path`, applies overrides ("key.path=value", in order), validates.
// Throws ConfigError on any problem. Does not open the data file, only checks
// that it exists (with check_files; see parse_config_text); its vocabulary is
// checked by validate_dataset_vocab later. Relative paths in the config stay
// relative to the working directory. job_ranks: the ranks of the job the config
// is read for, which decide parallel.hdp: auto (its training ranks, without
// loader.servers, over tp x pp; a ConfigError when they do not divide); 0 (no
// job): auto stays auto, checked as the least hdp its other keys allow.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {}, bool check_files = true,
                   int job_ranks = 0);
// Parses YAML text (used for the config stored inside checkpoints); `source_name`
// stands in for the file name in error messages. With check_files = false the
// existence of data.path and train.init_from is not checked (everything else is),
// so a config stored in a checkpoint can be read on another machine.
Config parse_config_text(const std::string& yaml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides = {}, bool check_files = true);
// The config stored in the manifest of `checkpoint` (Manifest::config), named
// "<checkpoint>/manifest.yaml (config)", read as parse_config_text with check_files =
// false, except that keys this build retired are skipped, not refused: a manifest holds
// every key of the build that wrote it, so refusing them would strand older checkpoints.
Config parse_manifest_config(const std::string& yaml_text, const std::string& checkpoint);

// The config as YAML with every key, in schema order (what Config::yaml holds).
// parse_config_text(emit_config_yaml(c), ...) gives back the same values.
std::string emit_config_yaml(const Config& config);

// One key whose value differs between two effective configs (Config::yaml): its
// "section.key" and the two values as written ("(absent)" where one lacks the key).
struct ConfigDifference {
  std::string key;
  std::string value, other_value;
};
// The keys whose lines differ between two effective configs, in the order of
// `yaml` (then keys only `other_yaml` has). Config::yaml holds one "key: value"
// line per key under its section's header, so comparing line by line is exact.
std::vector<ConfigDifference> config_differences(const std::string& yaml, const std::string& other_yaml);

// Whether this config's plans may offload activations: offload enabled, sequences
// longer than a micro-batch (only those are offloaded) and the naive or balance
// policy (the static grid never offloads).
inline bool may_offload(const Config& config) {
  return config.offload.enabled && config.scheduler.policy != SchedulerPolicy::Static &&
         config.data.max_seq_len > config.data.micro_batch_tokens;
}

// Whether this config's plans may recompute layers of the micro-batches above the
// capacity (train.recompute_per_micro_batch; planning/activation_mix.h): as offload,
// only for sequences longer than a micro-batch under the naive or balance policy.
inline bool may_plan_recompute(const Config& config) {
  return config.train.recompute_per_micro_batch && config.train.recompute != RecomputeMode::None &&
         config.scheduler.policy != SchedulerPolicy::Static && config.data.max_seq_len > config.data.micro_batch_tokens;
}

// data.format as the dataset reader's enum.
inline DatasetFormat dataset_format(const DataConfig& data) {
  return data.format == "megatron" ? DatasetFormat::Megatron : DatasetFormat::Hdf5;
}

// Called once the dataset is open: throws ConfigError (naming data.path and
// model.vocab_size) when the dataset's vocabulary is larger than model.vocab_size
// or it holds a token id >= model.vocab_size.
void validate_dataset_vocab(const Config& config, int64_t dataset_vocab_size,
                            uint32_t dataset_max_token_id);

// At start-up, before any step: throws ConfigError (naming the key, its origin and
// the rank) when train.run_dir (checked on rank 0, which writes the metrics) or,
// with checkpoints on, train.checkpoint_dir (every rank writes a part) cannot be
// created or written, instead of failing at the first metrics line or checkpoint.
void check_output_directories(const Config& config, int rank);

// Where checkpoints go: train.checkpoint_dir, or RUN_DIR/checkpoints when it is
// empty. The effective config keeps it empty unless set, so that a config carried
// to another run (import-hf's train-config.yaml, a checkpoint's config) puts
// checkpoints under that run's train.run_dir.
std::string resolved_checkpoint_dir(const TrainConfig& train);

}  // namespace hdp
