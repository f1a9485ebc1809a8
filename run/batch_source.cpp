#include "run/batch_source.h"

#include <algorithm>
#include <utility>

namespace hdp {

BatchSource::BatchSource(const Config& config, const CostModel& cost, const TokenDataset& dataset,
                         const SamplerState& start, const std::vector<SamplerState>& skipped, int hdp_rank)
    : config_(&config), dataset_(&dataset), hdp_rank_(hdp_rank), planner_(std::in_place, config, cost) {
  restart(start, skipped);
}

BatchSource::BatchSource(RemoteBatchClient& loader, int64_t steps) {
  prefetcher_.emplace([&loader, remaining = steps]() mutable { return remaining-- > 0 ? loader.next() : GlobalBatch{}; },
                      2);
}

void BatchSource::restart(const SamplerState& start, const std::vector<SamplerState>& skipped) {
  prefetcher_.reset();  // joins the prefetch thread before its sampler is replaced
  sampler_.emplace(*dataset_, sampler_options(config_->data), start);
  skipped_ = skipped;
  prefetcher_.emplace([this] { return next_local(); }, 2);
}

GlobalBatch BatchSource::next_local() {
  for (;;) {
    GlobalBatch batch = planner_->next_local_batch(*sampler_, *dataset_, hdp_rank_);
    if (std::find(skipped_.begin(), skipped_.end(), batch.start) == skipped_.end()) return batch;
  }
}

}  // namespace hdp
