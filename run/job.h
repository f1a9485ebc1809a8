#pragma once
// A training rank's job up to its first step (run_training, run/training.h): the
// process (world size, threads, GPU), the run's directories and checkpoint lock,
// the dataset, the process groups and their backend, the engine with its model,
// and where training starts: a checkpoint resumed, weights loaded, or fresh ones.

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "checkpoint/lock.h"
#include "checkpoint/manifest.h"
#include "config/config.h"
#include "data/dataset.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/runtime.h"
#include "run/engine.h"

namespace hdp {

// Rank 0's record of the run in train.run_dir (created): config.yaml, the effective
// config this start read (rewritten at each start), and train.log, every line rank 0
// logs from here until the process ends (its error too), appended across restarts
// and resumes. Other ranks: nothing. Throws ConfigError naming train.run_dir when
// config.yaml cannot be written.
void keep_run_record(const Config& config, int rank);

// train.precision not given and train.resume auto with a checkpoint to resume: the
// precision its run trained in (its effective config names it) rather than this
// device's default (config/config.cpp: bf16 on cuda), so a run started in fp32 goes
// on in fp32; rank 0 logs a change. Throws ConfigError where the kept precision
// conflicts with another key (train.attention: cudnn needs bf16).
void keep_resumed_precision(Config& config, int rank);

// Checks that every rank of the job runs the same config (a collective over
// MPI_COMM_WORLD: the hashes of the effective configs; ConfigError naming the
// keys and ranks that differ), that the job's ranks are the grid's plus
// loader.servers with a remote loader and that train.threads fits the cores this
// rank may run on; sets the threads per rank and binds the GPU (train.device:
// cuda). Returns the threads per rank.
int set_up_process(const Config& config, const ProcessInfo& process);

class TrainingJob {
 public:
  // Collective over the training ranks, `training_world` (null: every rank of
  // MPI_COMM_WORLD trains). Throws ConfigError, DatasetError and CheckpointError on
  // bad input, as run_training.
  TrainingJob(const Config& config, const ProcessInfo& process, std::unique_ptr<MpiCommunicator> training_world,
              int threads);
  TrainingJob(const TrainingJob&) = delete;
  TrainingJob& operator=(const TrainingJob&) = delete;

  ProcessGroups& groups() { return *groups_; }
  TrainingEngine& engine() { return *engine_; }
  // Where training starts (the step and data position done so far).
  const TrainingProgress& start() const { return start_; }
  // The engine's device memory, reported as the steps' peak_mem_bytes.
  size_t memory_bytes() const { return memory_.total(); }
  // The local loader's dataset; null with loader.mode: remote.
  const TokenDataset* dataset() const { return dataset_ ? &*dataset_ : nullptr; }
  // The directory locks rank 0 holds (checkpoint/lock.h), refreshed every step:
  // the run directory's, and the checkpoint directory's while the job reads or
  // writes checkpoints there. Empty on other ranks.
  std::vector<const DirectoryLock*> locks() const;

 private:
  std::optional<DirectoryLock> run_dir_lock_;
  std::optional<DirectoryLock> checkpoint_lock_;
  std::optional<TokenDataset> dataset_;
  std::unique_ptr<ProcessGroups> groups_;
  std::unique_ptr<TrainingEngine> engine_;
  MemoryReport memory_;
  TrainingProgress start_;
};

// Peak FLOP/s per training rank, the denominator of MFU: train.peak_flops if set;
// on a GPU of a known model its datasheet dense BF16 figure; else a measured fp32
// GEMM rate. CPU ranks sharing a node measure at the same time, each its share of
// the node, so every rank takes the mean over `world` (a collective).
double peak_flops_for_mfu(const TrainConfig& train, Device device, const ProcessInfo& process, Communicator& world,
                          int training_ranks);

}  // namespace hdp
