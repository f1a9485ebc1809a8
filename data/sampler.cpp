#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "base/rng.h"

namespace hdp {

void validate_sampler_options(const SamplerOptions& o) {
  auto positive = [](int64_t v, const char* name) {
    if (v < 1) throw std::invalid_argument(std::string("sampler: ") + name + " must be >= 1 (got " + std::to_string(v) + ")");
  };
  positive(o.max_seq_len, "max_seq_len");
  positive(o.global_batch_tokens, "global_batch_tokens");
  if (o.max_seq_len > o.global_batch_tokens)
    throw std::invalid_argument("sampler: max_seq_len (" + std::to_string(o.max_seq_len) +
                                ") must be <= global_batch_tokens (" + std::to_string(o.global_batch_tokens) + ")");
}

std::vector<int64_t> document_order(int64_t num_documents, bool shuffle, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(num_documents));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle && num_documents > 1) {
    Rng rng(seed, epoch);
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  }
  return order;
}

BatchSampler::BatchSampler(const TokenDataset& dataset, const SamplerOptions& options, const SamplerState& state)
    : dataset_(&dataset), options_(options), state_(state) {
  validate_sampler_options(options_);
  if (dataset.num_tokens() == 0) {
    // A bad input file, not a bad call: DatasetError, which the trainer reports with exit code 2.
    throw DatasetError("dataset '" + dataset.path() + "' holds no tokens, so there is nothing to train on; point "
                       "data.path at a dataset with documents (trainer prepare-data, trainer make-corpus)");
  }
  const int64_t n = dataset.num_documents();
  if (state_.cursor < 0 || state_.cursor > n || state_.document_offset < 0)
    throw std::invalid_argument("sampler: state (epoch " + std::to_string(state_.epoch) + ", cursor " +
                                std::to_string(state_.cursor) + ", offset " + std::to_string(state_.document_offset) +
                                ") does not fit dataset '" + dataset.path() + "' with " + std::to_string(n) +
                                " documents");
  if (state_.cursor < n) {
    int64_t doc = order(state_.epoch)[state_.cursor];
    int64_t len = dataset.document_length(doc);
    if (state_.document_offset > len || (state_.document_offset == len && len > 0))
      throw std::invalid_argument("sampler: state offset " + std::to_string(state_.document_offset) +
                                  " is past the end of document " + std::to_string(doc) + " (length " +
                                  std::to_string(len) + ") in dataset '" + dataset.path() + "'");
  } else if (state_.document_offset != 0) {
    throw std::invalid_argument("sampler: state at the end of an epoch must have document_offset 0");
  }
  normalize();
}

const std::vector<int64_t>& BatchSampler::order(uint64_t epoch) {
  if (order_epoch_ != epoch) {
    order_ = document_order(dataset_->num_documents(), options_.shuffle, options_.seed, epoch);
    order_epoch_ = epoch;
  }
  return order_;
}

void BatchSampler::normalize() {
  const int64_t n = dataset_->num_documents();
  while (true) {
    if (state_.cursor >= n) {
      state_.epoch += 1;
      state_.cursor = 0;
      state_.document_offset = 0;
      continue;
    }
    int64_t len = dataset_->document_length(order(state_.epoch)[state_.cursor]);
    if (state_.document_offset < len) return;
    state_.cursor += 1;
    state_.document_offset = 0;
  }
}

GlobalBatch BatchSampler::next() {
  GlobalBatch batch;
  batch.start = state_;
  while (true) {
    const int64_t doc = order(state_.epoch)[state_.cursor];
    const int64_t len = sequence_length_at(dataset_->document_length(doc), state_.document_offset, options_.max_seq_len);
    if (batch.tokens + len > options_.global_batch_tokens) break;  // never on the first (len <= budget)
    batch.sequences.push_back({doc, state_.document_offset, len});
    batch.tokens += len;
    state_.document_offset += len;
    normalize();
    if (batch.tokens == options_.global_batch_tokens) break;
  }
  batch.next = state_;
  return batch;
}

}  // namespace hdp
