#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>
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
  positive(o.micro_batch_tokens, "micro_batch_tokens");
  if (o.max_seq_len > o.global_batch_tokens)
    throw std::invalid_argument("sampler: max_seq_len (" + std::to_string(o.max_seq_len) +
                                ") must be <= global_batch_tokens (" + std::to_string(o.global_batch_tokens) + ")");
  if (o.micro_batch_tokens > INT32_MAX)
    throw std::invalid_argument("sampler: micro_batch_tokens must fit in int32");
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

std::vector<PackedMicroBatch> pack_best_fit(std::span<const SequenceSpan> sequences, int64_t capacity) {
  std::vector<int64_t> lengths(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) lengths[i] = sequences[i].length;
  std::vector<std::vector<size_t>> bins = best_fit_decreasing(lengths, capacity);
  std::vector<PackedMicroBatch> out(bins.size());
  for (size_t b = 0; b < bins.size(); ++b) {
    out[b].spans.reserve(bins[b].size());
    for (size_t i : bins[b]) out[b].spans.push_back(sequences[i]);
  }
  return out;
}

void materialize_micro_batch(const TokenDataset& dataset, PackedMicroBatch& mb) {
  // Whole sequences are the planned case where every piece is a whole sequence.
  PlannedMicroBatch whole;
  for (size_t i = 0; i < mb.spans.size(); ++i) whole.pieces.push_back({static_cast<int64_t>(i), 0, mb.spans[i].length});
  const std::vector<SequenceSpan> sequences = std::move(mb.spans);
  mb = materialize_planned(dataset, sequences, whole);
}

PackedMicroBatch materialize_planned(const TokenDataset& dataset, std::span<const SequenceSpan> sequences,
                                     const PlannedMicroBatch& planned) {
  return materialize_planned(
      [&](int64_t document, int64_t offset, int64_t length, int32_t* out) { dataset.read(document, offset, length, out); },
      sequences, planned);
}

PackedMicroBatch materialize_planned(const TokenReader& read, std::span<const SequenceSpan> sequences,
                                     const PlannedMicroBatch& planned) {
  PackedMicroBatch mb;
  mb.ring = planned.ring;
  mb.offload_ratio = planned.offload_ratio;
  const int64_t total = planned.tokens();
  mb.tokens.assign(static_cast<size_t>(total), 0);
  mb.targets.assign(static_cast<size_t>(total), -1);
  mb.positions.assign(static_cast<size_t>(total), 0);
  mb.cu_seqlens.assign(1, 0);
  std::vector<int32_t> next_token(1);
  int64_t row = 0;
  for (const PlannedPiece& p : planned.pieces) {
    const SequenceSpan& seq = sequences[p.sequence];
    if (p.offset < 0 || p.length < 1 || p.offset + p.length > seq.length) {
      throw std::invalid_argument("materialize_planned: piece outside its sequence");
    }
    mb.spans.push_back({seq.document, seq.offset + p.offset, p.length});
    read(seq.document, seq.offset + p.offset, p.length, mb.tokens.data() + row);
    for (int64_t i = 0; i < p.length; ++i) {
      mb.positions[row + i] = static_cast<int32_t>(p.offset + i);
      if (i + 1 < p.length) mb.targets[row + i] = mb.tokens[row + i + 1];
    }
    // The piece's last token predicts the first token after it, if the sequence goes on.
    if (p.offset + p.length < seq.length) {
      read(seq.document, seq.offset + p.offset + p.length, 1, next_token.data());
      mb.targets[row + p.length - 1] = next_token[0];
    }
    row += p.length;
    if (p.ring < 0) mb.cu_seqlens.push_back(static_cast<int32_t>(row));
  }
  return mb;
}

PackedMicroBatch materialize_micro_batch(const TokenDataset& dataset, std::span<const SequenceSpan> spans) {
  PackedMicroBatch mb;
  mb.spans.assign(spans.begin(), spans.end());
  materialize_micro_batch(dataset, mb);
  return mb;
}

// ---------------------------------------------------------------- sampler

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

GlobalBatch BatchSampler::next_plan() {
  GlobalBatch batch;
  batch.start = state_;
  while (true) {
    int64_t doc = order(state_.epoch)[state_.cursor];
    int64_t remaining = dataset_->document_length(doc) - state_.document_offset;
    int64_t len = std::min(remaining, options_.max_seq_len);
    if (batch.tokens + len > options_.global_batch_tokens) break;  // never on the first (len <= budget)
    batch.sequences.push_back({doc, state_.document_offset, len});
    batch.tokens += len;
    batch.predictions += len - 1;
    state_.document_offset += len;
    normalize();
    if (batch.tokens == options_.global_batch_tokens) break;
  }
  batch.next = state_;
  return batch;
}

void BatchSampler::pack(GlobalBatch& batch) const {
  // Packing keeps every sequence whole; planners that split long sequences across
  // ranks (planning/hdp_planner.h) use next_plan() instead.
  if (options_.max_seq_len > options_.micro_batch_tokens) {
    throw std::invalid_argument("sampler: packing needs max_seq_len (" + std::to_string(options_.max_seq_len) +
                                ") <= micro_batch_tokens (" + std::to_string(options_.micro_batch_tokens) + ")");
  }
  batch.micro_batches = pack_best_fit(batch.sequences, options_.micro_batch_tokens);
  for (PackedMicroBatch& mb : batch.micro_batches) materialize_micro_batch(*dataset_, mb);
}

GlobalBatch BatchSampler::next() {
  GlobalBatch batch = next_plan();
  pack(batch);
  return batch;
}

}  // namespace hdp
