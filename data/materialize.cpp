#include "data/materialize.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace hdp {
namespace {

PackedMicroBatch materialize_planned(const TokenReader& read, std::span<const SequenceSpan> sequences,
                                     const PlannedMicroBatch& planned) {
  PackedMicroBatch mb;
  mb.ring = planned.ring;
  mb.offload_ratio = planned.offload_ratio;
  mb.recompute_layers = planned.recompute_layers;
  const int64_t total = planned.tokens();
  // Rows, positions and cu_seqlens are int32 (the kernels' index type).
  if (total > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("materialize: a micro-batch of " + std::to_string(total) +
                                " tokens has more rows than int32 counts");
  }
  mb.tokens.assign(static_cast<size_t>(total), 0);
  mb.targets.assign(static_cast<size_t>(total), -1);
  mb.positions.assign(static_cast<size_t>(total), 0);
  mb.cu_seqlens.assign(1, 0);
  std::vector<int32_t> next_token(1);
  int64_t row = 0;
  for (const PlannedPiece& p : planned.pieces) {
    const SequenceSpan& seq = sequences[p.sequence];
    if (p.offset < 0 || p.length < 1 || p.offset + p.length > seq.length) {
      throw std::invalid_argument("materialize: piece [" + std::to_string(p.offset) + ", " +
                                  std::to_string(p.offset + p.length) + ") outside sequence " +
                                  std::to_string(p.sequence) + " of " + std::to_string(seq.length) + " tokens");
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

}  // namespace

TokenReader dataset_reader(const TokenDataset& dataset) {
  return [&dataset](int64_t document, int64_t offset, int64_t length, int32_t* out) {
    dataset.read(document, offset, length, out);
  };
}

std::vector<PackedMicroBatch> materialize_rank_work(const TokenReader& read, std::span<const SequenceSpan> sequences,
                                                    std::span<const RankMicroBatch> work) {
  std::vector<PackedMicroBatch> out;
  out.reserve(work.size());
  for (const RankMicroBatch& planned : work) {
    out.push_back(materialize_planned(read, sequences, planned.planned));
    out.back().ring_layout = planned.ring_layout;
  }
  return out;
}

PackedMicroBatch materialize_sequences(const TokenReader& read, std::span<const SequenceSpan> sequences) {
  // Whole sequences are the planned case where every piece is a whole sequence.
  PlannedMicroBatch whole;
  whole.pieces.reserve(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) whole.pieces.push_back({static_cast<int64_t>(i), 0, sequences[i].length});
  return materialize_planned(read, sequences, whole);
}

}  // namespace hdp
