#pragma once
// Where a training rank's batches come from, produced a step or two ahead in a
// prefetch thread (data/prefetcher.h). Local (loader.mode: local): every rank
// samples the same sequences and makes the same plan, then reads only its own
// micro-batches; global batches recorded as bad (rollbacks, run/training_loop.h)
// are drawn and dropped, on every rank alike. Remote: the loader's scheduler plans
// and the servers send this rank's tokens (data/remote_loader.h).

#include <cstdint>
#include <optional>
#include <vector>

#include "config/config.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/prefetcher.h"
#include "data/remote_loader.h"
#include "data/sampler.h"
#include "planning/cost_model.h"
#include "run/step_planner.h"

namespace hdp {

class BatchSource {
 public:
  // Local: from sampler position `start` on, planning with `cost`, skipping the global
  // batches that begin at one of `skipped`; this rank's micro-batches are hdp rank `hdp_rank`'s.
  BatchSource(const Config& config, const CostModel& cost, const TokenDataset& dataset, const SamplerState& start,
              const std::vector<SamplerState>& skipped, int hdp_rank);
  // Remote: the next `steps` batches from the loader; past them there is no work to wait for.
  BatchSource(RemoteBatchClient& loader, int64_t steps);
  // The prefetch thread calls back into this object: it stays where it was made.
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  GlobalBatch next() { return prefetcher_->next(); }

  // Local only: whether restart() is possible.
  bool restartable() const { return dataset_ != nullptr; }
  // Drops the batches prefetched so far and goes on from `start`, skipping the
  // global batches that begin at one of `skipped`.
  void restart(const SamplerState& start, const std::vector<SamplerState>& skipped);

 private:
  GlobalBatch next_local();

  const Config* config_ = nullptr;         // local
  const TokenDataset* dataset_ = nullptr;  // local
  int hdp_rank_ = 0;
  std::optional<StepPlanner> planner_;   // local
  std::optional<BatchSampler> sampler_;  // local
  std::vector<SamplerState> skipped_;    // local: starts of the global batches to drop
  std::optional<BatchPrefetcher> prefetcher_;
};

}  // namespace hdp
