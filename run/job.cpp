#include "run/job.h"

#include <mpi.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/yaml_reader.h"
#include "checkpoint/directory.h"
#include "checkpoint/protocol.h"
#include "checkpoint/tokenizer_copy.h"
#include "config/checks.h"
#include "config/model_agreement.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/peak_flops.h"
#include "model/lr_schedule.h"
#include "parallel/nccl_communicator.h"
#include "run/signals.h"

namespace hdp {
namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

void check_world_size(const ParallelDegrees& degrees, bool remote, int loader_ranks, const ProcessInfo& process) {
  const int training_ranks = degrees.world();
  if (training_ranks + loader_ranks != process.world_size) {
    throw ConfigError("parallel.tp x parallel.pp x parallel.hdp = " + std::to_string(degrees.tp) + " x " +
                      std::to_string(degrees.pp) + " x " + std::to_string(degrees.hdp) + " = " +
                      std::to_string(training_ranks) + " ranks" +
                      (remote ? " plus loader.servers = " + std::to_string(loader_ranks) : std::string()) +
                      ", but the job has " + std::to_string(process.world_size) + "; launch with mpirun -np " +
                      std::to_string(training_ranks + loader_ranks) + " or change the degrees");
  }
}

// FNV-1a, 64 bits (Fowler, Noll and Vo): the same text hashes alike on every rank,
// whatever the C++ library.
uint64_t fnv1a64(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
  return hash;
}

// Every rank of the job (loader ranks too) must run the config rank 0 runs: a rank
// started with another learning rate or data seed would train silently on its
// own, and another model size would fail inside a collective naming nothing. One
// all-gather of the hashes of the effective configs; only when they differ, rank
// 0's config travels to every rank, each names the keys where its own differs,
// and every rank throws the same message with all of them (ConfigError, exit 2).
void check_ranks_agree_on_config(const Config& config, const ProcessInfo& process) {
  if (process.world_size == 1) return;
  const uint64_t mine = fnv1a64(config.yaml);
  std::vector<uint64_t> hashes(static_cast<size_t>(process.world_size));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  if (std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; })) return;
  uint64_t size = config.yaml.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  std::string rank0_yaml(size, '\0');
  if (process.rank == 0) rank0_yaml = config.yaml;
  MPI_Bcast(rank0_yaml.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string differences;
  if (hashes[static_cast<size_t>(process.rank)] != hashes[0]) {
    for (const ConfigDifference& d : config_differences(config.yaml, rank0_yaml))
      differences += (differences.empty() ? "rank " + std::to_string(process.rank) + ": " : ", ") + d.key + " " +
                     d.value + " (rank 0: " + d.other_value + ")";
  }
  // Every rank's list, to every rank.
  const int length = static_cast<int>(differences.size());
  std::vector<int> lengths(static_cast<size_t>(process.world_size)), offsets(lengths.size() + 1, 0);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (size_t r = 0; r < lengths.size(); ++r) offsets[r + 1] = offsets[r] + lengths[r];
  std::string all(static_cast<size_t>(offsets.back()), '\0');
  MPI_Allgatherv(differences.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                 MPI_COMM_WORLD);
  std::string message;
  for (size_t r = 0; r < lengths.size(); ++r)
    if (lengths[r] > 0) message += (message.empty() ? "" : "; ") + all.substr(offsets[r], lengths[r]);
  if (message.empty()) return;  // the same text after all
  throw ConfigError("the ranks of this job were started with different configs: " + message +
                    ". Start every rank with the same config file and --set overrides");
}

// train.threads against the cores this rank may run on (config/config.h).
void check_threads(const Config& config, const ProcessInfo& process) {
  const int64_t cores = available_cores();
  if (config.train.threads <= kThreadsPerCore * cores) return;
  const auto it = config.origins.find("train.threads");
  throw_config_error(it != config.origins.end() ? it->second : config.source + ":1", "train.threads",
                     std::to_string(config.train.threads) + " threads on rank " + std::to_string(process.rank) +
                         ", which may run on " + std::to_string(cores) + " core(s): more than " +
                         std::to_string(kThreadsPerCore) + " per core only contend",
                     "choose at most " + std::to_string(kThreadsPerCore * cores) +
                         ", or 0 for the node's cores divided among its ranks");
}

// train.resume: never starts at step 0. A run that writes checkpoints would then
// replace those of a previous run of this config in train.checkpoint_dir (another
// run's are refused by check_checkpoint_dir_run) and its metrics: refused, naming
// the directories, unless train.start_over, which deletes those checkpoints first
// (rank 0, holding both directories' locks; metrics.jsonl starts afresh anyway).
void start_afresh(const Config& config) {
  const TrainConfig& t = config.train;
  const std::string checkpoint_dir = resolved_checkpoint_dir(t);
  if (t.checkpoint_every == 0 && !t.start_over) return;  // nothing of a previous run is replaced
  const std::optional<std::string> latest = latest_checkpoint(checkpoint_dir);
  if (!latest) return;
  if (!t.start_over) {
    const auto it = config.origins.find("train.resume");
    throw_config_error(it != config.origins.end() ? it->second : config.source + ":1", "train.resume",
                       "'never' starts at step 0, but train.checkpoint_dir '" + checkpoint_dir +
                           "' holds the checkpoints of a previous run of this config (the newest " + *latest +
                           "), which this run's checkpoints and its metrics in train.run_dir '" + t.run_dir +
                           "' would replace",
                       "set train.start_over: true to delete them and start over, or train.resume: auto to continue "
                       "that run");
  }
  const int deleted = delete_checkpoints_after(checkpoint_dir, 0);
  spdlog::warn("train.start_over: deleted {} checkpoint(s) of a previous run in {} (the newest {}); metrics.jsonl in "
               "{} starts afresh", deleted, checkpoint_dir, *latest, t.run_dir);
}

// The GPU of the local rank modulo those visible (CUDA_VISIBLE_DEVICES): one per
// rank when there are enough, else several ranks of a node share one.
void bind_gpu(const TrainConfig& train, const ProcessInfo& process) {
  std::string why;
  if (!cuda::available(&why)) {
    throw ConfigError("train.device: cuda asked for, but rank " + std::to_string(process.rank) + " on " +
                      process.hostname + " has no usable CUDA device (" + why + ")");
  }
  const int visible = cuda::device_count();
  const int gpu = process.local_rank % visible;
  cuda::initialize(gpu);
  cuda::set_tf32(train.tf32);
  set_attention_impl(train.attention);
  spdlog::info("rank {} (local rank {}): GPU {} of {} visible{}, {}{}", process.rank, process.local_rank, gpu,
               visible, process.local_size > visible ? " (shared by the node's ranks)" : "",
               cuda::device_description(), train.tf32 ? ", fp32 GEMMs on TF32 tensor cores" : "");
  if (train.precision == DType::BF16 && train.attention != AttentionImpl::Own && process.rank == 0)
    spdlog::info("train.attention: {}: bf16 attention runs on cuDNN's fused kernels where they take the call, whose "
                 "backward is not bit-reproducible (train.attention: own for bit-exact resume)",
                 enum_name(kAttentionImplNames, train.attention));
}

// parallel.comm resolved on the training ranks (collective over `training_world`, or
// over every rank when it is null, after bind_gpu). nccl: exit 2 when two ranks share a GPU, which NCCL refuses,
// naming them and the GPU. auto: NCCL when the ranks train on GPUs of their own and
// NCCL was built; ranks sharing a GPU (tests, small machines) go through MPI.
CommBackend choose_comm_backend(const Config& config, const MpiCommunicator* training_world,
                                const ProcessInfo& process) {
  const CommMode mode = config.parallel.comm;
  if (mode == CommMode::Mpi || config.train.device != Device::CUDA || !nccl_compiled()) return CommBackend::Mpi;
  const std::string shared = gpus_shared_by_ranks(training_world, process.hostname);
  if (shared.empty()) return CommBackend::Nccl;
  if (mode == CommMode::Nccl) {
    throw ConfigError("parallel.comm: nccl needs one GPU per rank, but " + shared +
                      " (NCCL refuses two ranks of one communicator on one GPU); give each rank its own GPU "
                      "(more GPUs, or fewer ranks per node), or set parallel.comm: mpi to stage through host memory");
  }
  if (process.rank == 0) spdlog::info("parallel.comm auto: MPI, because {}", shared);
  return CommBackend::Mpi;
}

// Rank 0's summary of the job: where the data comes from, the grid, the BLAS kernels.
void log_job(const Config& config, const std::optional<TokenDataset>& dataset, const ParallelDegrees& degrees,
             int loader_ranks) {
  const int training_ranks = degrees.world();
  if (dataset) {
    spdlog::info("dataset {}: {} documents, {} tokens", config.data.path, dataset->num_documents(),
                 dataset->num_tokens());
  } else {
    spdlog::info("data from {} loader rank(s) (world ranks {}..{}), scheduler on world rank {}", loader_ranks,
                 training_ranks, training_ranks + loader_ranks - 1, training_ranks);
  }
  spdlog::info("{}", describe_grid(degrees));
  // Documented (a rank's capacity, not its share), but rarely meant: the activation
  // memory is sized for micro_batch_tokens and a step never fills it.
  if (config.data.global_batch_tokens < config.data.micro_batch_tokens) {
    spdlog::warn("data.global_batch_tokens {} is below data.micro_batch_tokens {}: a step holds at most {} tokens, so "
                 "every micro-batch is at most {:.0f}% full while activation memory is sized for {}; lower "
                 "data.micro_batch_tokens to save memory, or raise data.global_batch_tokens",
                 config.data.global_batch_tokens, config.data.micro_batch_tokens, config.data.global_batch_tokens,
                 100.0 * config.data.global_batch_tokens / config.data.micro_batch_tokens,
                 config.data.micro_batch_tokens);
  }
  spdlog::info("CPU GEMM: {}", cpu::gemm_library_description(cpu::kGemmLibrary));
}

// The stage's layers, parameters and memory, once per pipeline stage.
void log_stage(TrainingEngine& engine, const MemoryReport& memory, const GridCoords& coords) {
  if (coords.tp_rank != 0 || coords.hdp_rank != 0) return;
  std::string layers;
  for (int64_t n : engine.stage_layers()) layers += (layers.empty() ? "" : " + ") + std::to_string(n);
  spdlog::info("stage {} (layers {}): {:.2f} M parameters on this rank; device memory {:.1f} MiB (parameters {:.1f}, "
               "gradients {:.1f}, optimizer shard {:.1f}, activations {:.1f} in {}, pipeline buffers {:.1f}, ring buffers "
               "{:.1f}); host pool for offloaded activations {:.1f} MiB",
               coords.pp_rank, layers, engine.model().num_parameters() / 1e6, mib(memory.total()),
               mib(memory.parameters), mib(memory.gradients), mib(memory.optimizer), mib(memory.activations),
               dtype_name(engine.model().precision()),
               mib(memory.pipeline), mib(memory.ring), mib(memory.host_pool));
  const LlamaModel& model = engine.model();
  const int64_t recomputed = model.recompute_layers(), stage_layers = model.num_layers();
  const char* sequence_parallel =
      model.sequence_parallel() ? "; sequence parallel: the norms' and residual stream's for 1/tp of the tokens" : "";
  const std::string mode = enum_name(kRecomputeModeNames, model.recompute_mode());
  if (model.planned_recompute()) {
    const double whole = model.whole_layer_bytes_per_token();
    spdlog::info("stage {}: activations saved per token and layer: {:.0f} bytes in a layer that keeps everything, "
                 "{:.0f} bytes in one that recomputes ({}): up to the first {} layers of a micro-batch above the "
                 "capacity, as the step planner chooses{}",
                 coords.pp_rank, whole, model.saved_bytes_per_token(0), mode, recomputed, sequence_parallel);
    return;
  }
  spdlog::info("stage {}: activations saved per token and layer: {:.0f} bytes in the {} layers that recompute ({}), "
               "{:.0f} bytes in the other {}{}",
               coords.pp_rank, model.saved_bytes_per_token(0), recomputed, mode,
               model.saved_bytes_per_token(stage_layers - 1), stage_layers - recomputed, sequence_parallel);
}

// The schedule the run of `checkpoint` followed: recorded in its manifest, or in
// checkpoints older than that record, its config's. None when neither can be read.
std::optional<RunSchedule> checkpoint_schedule(const std::string& checkpoint, const Manifest& manifest) {
  if (manifest.progress.lr_schedule) return manifest.progress.lr_schedule;
  try {
    const Config theirs = parse_manifest_config(manifest.config, checkpoint);
    return RunSchedule{theirs.optim, theirs.train.steps};
  } catch (const ConfigError& e) {
    spdlog::warn("{}: cannot read the config it was written with ({}); not checking that the learning-rate schedule "
                 "continues", checkpoint, e.what());
    return std::nullopt;
  }
}

// "train.steps 200 -> 400; optim.lr 0.002 -> 0.001": the schedule's keys that differ.
std::string schedule_differences(const RunSchedule& before, const RunSchedule& now) {
  std::string out;
  auto differ = [&](const std::string& key, const std::string& a, const std::string& b) {
    if (a != b) out += (out.empty() ? "" : "; ") + key + " " + a + " -> " + b;
  };
  const LearningRateSchedule &a = before.schedule, &b = now.schedule;
  differ("optim.schedule", enum_name(kLrScheduleNames, a.kind), enum_name(kLrScheduleNames, b.kind));
  differ("optim.lr", format_double(a.lr), format_double(b.lr));
  differ("optim.min_lr", format_double(a.min_lr), format_double(b.min_lr));
  differ("optim.warmup_steps", std::to_string(a.warmup_steps), std::to_string(b.warmup_steps));
  differ("optim.decay_steps", std::to_string(a.decay_steps), std::to_string(b.decay_steps));
  differ("optim.decay_fraction", format_double(a.decay_fraction), format_double(b.decay_fraction));
  differ("train.steps", std::to_string(before.steps), std::to_string(now.steps));
  return out;
}

// "cosine over steps 21-200"
std::string describe_decay(const RunSchedule& run) {
  const LrDecay d = lr_decay(run.schedule, run.steps);
  const std::string kind = enum_name(kLrScheduleNames, run.schedule.kind);
  if (d.length == 0) return kind + " without a decay";
  return kind + " decay over steps " + std::to_string(d.start + 1) + "-" + std::to_string(d.start + d.length);
}

// A resume must not make the learning rate jump (a changed train.steps used to
// restart the cosine decay silently): refused, naming the keys, unless
// train.allow_schedule_change.
void check_schedule_continues(const Config& config, const std::string& checkpoint, int rank) {
  const Manifest manifest = read_manifest(checkpoint);
  const std::optional<RunSchedule> before = checkpoint_schedule(checkpoint, manifest);
  if (!before) return;
  const RunSchedule now{config.optim, config.train.steps};
  const std::string changed = schedule_differences(*before, now);
  if (changed.empty()) return;
  const int64_t step = manifest.progress.step;
  const std::string next = std::to_string(step + 1);
  if (schedule_continues(*before, now, step)) {
    if (rank == 0)
      spdlog::info("learning-rate schedule changed since {} ({}); it continues from step {}'s rate, {:.4g}",
                   checkpoint, changed, next, learning_rate(now, step + 1));
    return;
  }
  const std::string jump = "resuming " + checkpoint + " (step " + std::to_string(step) +
                           ") changes the learning rate of step " + next + " from " +
                           format_double(learning_rate(*before, step + 1)) + " to " +
                           format_double(learning_rate(now, step + 1)) + ": " + changed + " (its run: " +
                           describe_decay(*before) + "; this config: " + describe_decay(now) + ")";
  if (config.train.allow_schedule_change) {
    if (rank == 0) spdlog::warn("{}; resuming with the new schedule (train.allow_schedule_change: true)", jump);
    return;
  }
  // The checkpoint's decay kept by giving its length explicitly, when that continues.
  RunSchedule kept = now;
  kept.schedule.decay_steps = lr_decay(before->schedule, before->steps).length;
  const std::string keep_decay =
      kept.schedule.decay_steps > 0 && schedule_continues(*before, kept, step)
          ? ", set optim.decay_steps: " + std::to_string(kept.schedule.decay_steps) + " to keep its decay"
          : "";
  throw ConfigError(jump + "; keep those keys as the checkpoint's run had them" + keep_decay +
                    ", or set train.allow_schedule_change: true to resume with the jump");
}

// train.init_from's weights must be of this config's model (config/model_agreement.h):
// its shape keys always, its numerics keys unless train.allow_model_change, which
// logs each difference. The weights' shapes alone would let a model trained with
// another rope_theta, norm_eps or window train silently under this config's.
void check_init_from_model(const Config& config, int rank) {
  const std::string& checkpoint = config.train.init_from;
  const Config theirs = parse_manifest_config(read_manifest(checkpoint).config, checkpoint);
  std::vector<ModelKeyDifference> shape, numerics;
  for (const ModelKeyDifference& d : model_differences(theirs, config))
    (d.kind == ModelKeyKind::Shape ? shape : numerics).push_back(d);
  if (!shape.empty())
    throw ConfigError("train.init_from: " + checkpoint + " holds the weights of another model: " +
                      describe_model_differences(shape, "checkpoint", "config") +
                      "; set these keys as the checkpoint's model has them");
  if (numerics.empty()) return;
  const std::string differ = describe_model_differences(numerics, "checkpoint", "config");
  if (!config.train.allow_model_change)
    throw ConfigError("train.init_from: " + checkpoint + "'s model computes differently from this config's: " +
                      differ + "; set these keys as the checkpoint's model has them, or set "
                      "train.allow_model_change: true to train its weights under this config's values");
  if (rank == 0)
    for (const ModelKeyDifference& d : numerics)
      spdlog::warn("train.init_from: {} {} in {}, {} here (train.allow_model_change: true)", d.key, d.value,
                   checkpoint, d.other_value);
}

// Where training starts: a checkpoint to resume (weights, moments, step, data
// position), a checkpoint to take weights from, or fresh weights.
// `data_tokenizer`: the identity of data.path's tokenizer ("" when this rank does not
// read the data); a checkpoint trained with another one is refused.
TrainingProgress restore_or_init(const Config& config, TrainingEngine& engine, int rank,
                                 const std::string& data_tokenizer) {
  const TrainConfig& t = config.train;
  const std::string checkpoint_dir = resolved_checkpoint_dir(t);
  if (rank == 0 && (t.resume == ResumeMode::Auto || t.checkpoint_every > 0)) {
    for (const std::string& dir : manifestless_checkpoints(checkpoint_dir)) {
      spdlog::warn("{} has no manifest.yaml, so it is not a complete checkpoint: not resumed from and not deleted; a "
                   "checkpoint of its step moves it to {}.incomplete first. Look at it, then delete it or move it "
                   "out of train.checkpoint_dir", dir, dir);
    }
  }
  if (t.resume == ResumeMode::Auto) {
    std::vector<std::string> suspect;
    const std::optional<std::string> latest = latest_resumable_checkpoint(checkpoint_dir, &suspect);
    if (rank == 0 && !suspect.empty()) {
      std::string list;
      for (const std::string& s : suspect) list += (list.empty() ? "" : "; ") + s;
      spdlog::warn("resume: auto passes by {} suspect checkpoint(s): {}", suspect.size(), list);
    }
    if (latest) {
      check_schedule_continues(config, *latest, rank);
      check_data_tokenizer(*latest, read_manifest(*latest), config.data.path, data_tokenizer, "resuming");
      TrainingProgress progress = load_checkpoint(*latest, engine.model(), &engine.optimizer());
      spdlog::info("resumed from {} at step {}", *latest, progress.step);
      return progress;
    }
  }
  TrainingProgress progress;
  progress.train_seed = t.seed;
  progress.data_seed = config.data.seed;
  if (!t.init_from.empty()) {
    check_init_from_model(config, rank);
    check_data_tokenizer(t.init_from, read_manifest(t.init_from), config.data.path, data_tokenizer, "train.init_from");
    load_checkpoint(t.init_from, engine.model(), nullptr);
    spdlog::info("initial weights from {}", t.init_from);
  } else {
    engine.model().init_weights(t.seed);
  }
  return progress;
}

}  // namespace

void keep_run_record(const Config& config, int rank) {
  if (rank != 0) return;
  namespace fs = std::filesystem;
  const fs::path dir(config.train.run_dir);
  const std::string config_file = (dir / "config.yaml").string();
  if (!(std::ofstream(config_file, std::ios::trunc) << config.yaml)) {
    throw ConfigError("train.run_dir: cannot write the effective config to " + config_file +
                      "; point train.run_dir at a directory this user can write");
  }
  // One log file per process: a later job in the same process replaces the sink.
  static std::shared_ptr<spdlog::sinks::basic_file_sink_mt> log_sink;
  auto logger = spdlog::default_logger();
  auto& sinks = logger->sinks();
  if (log_sink) sinks.erase(std::remove(sinks.begin(), sinks.end(), log_sink), sinks.end());
  log_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>((dir / "train.log").string(), /*truncate=*/false);
  log_sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %l %v");
  sinks.push_back(log_sink);
  logger->flush_on(spdlog::level::info);  // a killed job keeps its lines
  spdlog::info("run directory {}: config.yaml (the effective config), train.log (this log), metrics.jsonl; "
               "checkpoints in {}", config.train.run_dir, resolved_checkpoint_dir(config.train));
}

void keep_resumed_precision(Config& config, int rank) {
  if (config.train.resume != ResumeMode::Auto || config.origins.count("train.precision")) return;
  std::vector<std::string> suspect;  // restore_or_init logs them
  const std::optional<std::string> latest = latest_resumable_checkpoint(resolved_checkpoint_dir(config.train), &suspect);
  if (!latest) return;
  DType before;
  try {
    before = parse_manifest_config(read_manifest(*latest).config, *latest).train.precision;
  } catch (const ConfigError&) {
    return;  // an unreadable config: resuming reports it where it reads the checkpoint
  }
  if (before == config.train.precision) return;
  if (rank == 0)
    spdlog::info("train.precision: {}, as {} was trained (not given here, where the default is {})",
                 enum_name(kPrecisionNames, before), *latest, enum_name(kPrecisionNames, config.train.precision));
  config.train.precision = before;
  check_config(config, /*check_files=*/false);
  config.yaml = emit_config_yaml(config);
}

int set_up_process(const Config& config, const ProcessInfo& process) {
  const bool remote = config.loader.mode == LoaderMode::Remote;
  check_ranks_agree_on_config(config, process);
  check_world_size(config.parallel, remote, remote ? static_cast<int>(config.loader.servers) : 0, process);
  check_threads(config, process);
  const int threads = configure_threads(config.train.threads, process);
  if (config.train.device == Device::CUDA) {
    bind_gpu(config.train, process);
    if (config.model.moe() && process.rank == 0)
      spdlog::warn("model.arch: mixtral on cuda: the MoE block's kernels pass `trainer selftest` on an H200 (fp32 "
                   "training steps, bf16 ops), but no Mixtral run has trained on a GPU yet");
  }
  return threads;
}

TrainingJob::TrainingJob(const Config& config, const ProcessInfo& process,
                         std::unique_ptr<MpiCommunicator> training_world, int threads) {
  const ParallelDegrees& degrees = config.parallel;
  const bool remote = config.loader.mode == LoaderMode::Remote;
  const int loader_ranks = remote ? static_cast<int>(config.loader.servers) : 0;
  check_output_directories(config, process.rank);
  // One job per run directory and per checkpoint directory (checkpoint/lock.h):
  // locks while this job appends metrics there and reads or writes checkpoints
  // there (a resume reads an existing directory), and no continuing another run's
  // checkpoints unless asked, nor starting a new run over this one's unless told.
  const TrainConfig& t = config.train;
  const std::string checkpoint_dir = resolved_checkpoint_dir(t);
  if (process.rank == 0) {
    const double stale_after_s = 2 * t.hang_timeout_s;
    run_dir_lock_.emplace(LockedDirectory::Run, t.run_dir, process.hostname, stale_after_s);
    std::error_code ec;
    if (t.checkpoint_every > 0 || t.start_over ||
        (t.resume == ResumeMode::Auto && std::filesystem::is_directory(checkpoint_dir, ec)))
      checkpoint_lock_.emplace(LockedDirectory::Checkpoints, checkpoint_dir, process.hostname, stale_after_s);
  }
  if (t.checkpoint_every > 0 || t.resume == ResumeMode::Auto) check_checkpoint_dir_run(config);
  if (t.resume == ResumeMode::Never && process.rank == 0) start_afresh(config);
  // After the locks and the checks that refuse to replace a run: a job refused
  // here must not rewrite the record of the run it was kept out of.
  keep_run_record(config, process.rank);
  // A signal stops a local-loader run at the next step boundary with a checkpoint.
  // Remote loader ranks plan every step up to train.steps and cannot stop early
  // yet, so there signals keep their default action (the job ends at once).
  if (!remote) install_stop_handlers(process.rank == 0);
  if (!remote) {
    dataset_.emplace(TokenDataset::open(config.data.path, dataset_format(config.data)));
    validate_dataset_vocab(config, dataset_->vocab_size(), dataset_->max_token_id());
  }

  const CommBackend backend = choose_comm_backend(config, training_world.get(), process);
  groups_ = std::make_unique<ProcessGroups>(degrees, config.model.tie_embeddings, std::move(training_world), backend);
  if (process.rank == 0) spdlog::info("tp, pp and hdp groups over {}", backend == CommBackend::Nccl ? "NCCL" : "MPI");
  const GridCoords& coords = groups_->coords();
  spdlog::info("rank {} on {}: tp {} pp {} hdp {}; {} threads", process.rank, process.hostname, coords.tp_rank,
               coords.pp_rank, coords.hdp_rank, threads);
  if (process.rank == 0) log_job(config, dataset_, degrees, loader_ranks);
  engine_ = std::make_unique<TrainingEngine>(config, *groups_);
  memory_ = engine_->memory();
  log_stage(*engine_, memory_, coords);
  start_ = restore_or_init(config, *engine_, process.rank, dataset_ ? dataset_->tokenizer() : std::string());
}

std::vector<const DirectoryLock*> TrainingJob::locks() const {
  std::vector<const DirectoryLock*> held;
  for (const auto* lock : {&run_dir_lock_, &checkpoint_lock_})
    if (*lock) held.push_back(&**lock);
  return held;
}

double peak_flops_for_mfu(const TrainConfig& train, Device device, const ProcessInfo& process, Communicator& world,
                          int training_ranks) {
  const bool on_gpu = device == Device::CUDA;
  double peak_flops = train.peak_flops;
  if (peak_flops <= 0 && on_gpu) {
    peak_flops = gpu_bf16_peak_flops(cuda::device_description());
    if (process.rank == 0 && peak_flops > 0) {
      spdlog::info("peak: {:.0f} TFLOP/s dense BF16 (datasheet) per GPU for MFU", peak_flops / 1e12);
    }
  }
  if (peak_flops <= 0) {
    // Said first: the probe takes 1-15 s, silent otherwise.
    if (process.rank == 0) {
      spdlog::info("peak: measuring the fp32 GEMM rate for MFU (a few seconds; train.peak_flops skips this)");
    }
    peak_flops = measure_gemm_flops(device);
    if (!on_gpu) peak_flops = world.all_reduce_sum(peak_flops) / training_ranks;
    if (process.rank == 0 && on_gpu) {
      spdlog::info("peak: {:.1f} TFLOP/s fp32 GEMM measured on this GPU (unknown model); set train.peak_flops to fix it",
                   peak_flops / 1e12);
    } else if (process.rank == 0) {
      spdlog::info("peak: {:.1f} GFLOP/s fp32 GEMM per rank measured, best of (rank 0) {}; set train.peak_flops "
                   "to fix it", peak_flops / 1e9, cpu_gemm_rates_summary());
    }
  }
  return peak_flops;
}

}  // namespace hdp
