#pragma once
// Where `trainer plan` (docs/planning.md) takes the document lengths of a global
// batch from: a built-in length distribution modelled on published data
// (the Byted and GitHub distributions of ByteScale, Ge et al., 2025, its section
// on data heterogeneity), a text file of lengths, or an HDF5 token
// dataset (data/dataset.h).
//
// Built-in distributions are piecewise power laws. Each segment [lo, hi] has a
// sample probability p and a token share s (the fraction of all tokens that come
// from documents in the segment); with mean document length mu, the segment's
// mean length must be s mu / p, and the density inside it, proportional to
// x^-a, gets the exponent a that gives exactly that mean (a point mass when
// lo = hi). So both the sample fractions and the token shares of every segment
// are those of the specification, in expectation.
//
// - "byted" (ByteScale's production long-context data): 80% of documents at
//   most 4K tokens; 0.05% exactly 2M (2,097,152) tokens carrying 12.1% of the
//   tokens; 1% at least 128K carrying 44.3%; documents over 256K carry 37%.
// - "github" (GitHub code): documents over 128K carry 16.2% of the tokens, over
//   256K 9.8%; the bulk (85% of files under 4K tokens, mean about 3,000 tokens)
//   is our assumption, not a published figure.

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/errors.h"
#include "base/rng.h"
#include "data/batch.h"

namespace hdp {

// A bad distribution name, an unreadable or malformed lengths file. The message
// names the file (and line) or the name and the valid choices.
class LengthsInputError : public InputError {
 public:
  using InputError::InputError;
};

struct LengthSegment {
  int64_t lo = 1, hi = 1;     // lengths in [lo, hi] tokens
  double probability = 0;     // fraction of documents
  double token_share = 0;     // fraction of tokens
};

struct LengthDistribution {
  std::string name;
  std::string description;
  std::vector<LengthSegment> segments;  // in increasing length, not overlapping
  double mean_length = 0;               // mu
};

// The built-in names, in a fixed order ("byted", "github").
std::vector<std::string> builtin_distribution_names();
// Throws LengthsInputError naming the valid choices for an unknown name.
LengthDistribution builtin_distribution(const std::string& name);

// Draws document lengths from a distribution (deterministic for a seed).
// Throws std::invalid_argument if the specification is inconsistent:
// probabilities or shares not summing to 1, a segment mean outside [lo, hi].
class LengthSampler {
 public:
  LengthSampler(LengthDistribution distribution, uint64_t seed);
  int64_t next();
  const LengthDistribution& distribution() const { return distribution_; }
  // The solved exponent a of each segment (density proportional to x^-a).
  const std::vector<double>& exponents() const { return exponents_; }

 private:
  LengthDistribution distribution_;
  std::vector<double> exponents_, cumulative_;
  Rng rng_;
};

// The mean of density x^-a on [lo, hi] (continuous), and the exponent giving a
// mean m (lo < m < hi).
double power_law_mean(double lo, double hi, double a);
double power_law_exponent_for_mean(double lo, double hi, double mean);

// Sequences of a global batch from documents in order: each document is cut
// into sequences as the trainer cuts them (sequence_length_at, data/batch.h:
// pieces of at most `context` tokens; a 2,500-token document at context 1,024:
// 1024, 1024, 452), and pieces are taken while the total stays within
// global_batch_tokens; the first piece that would exceed it ends the batch (the
// trainer's sampler rule, data/sampler.h). `next_document` returns the next
// length, or 0 when there are no more documents. Documents of length 0 are
// skipped.
template <class Next>
std::vector<int64_t> fill_global_batch(Next&& next_document, int64_t context, int64_t global_batch_tokens) {
  if (context < 1 || global_batch_tokens < 1)
    throw std::invalid_argument("fill_global_batch: context and global batch tokens must be at least 1");
  std::vector<int64_t> sequences;
  int64_t total = 0;
  while (true) {
    int64_t doc = next_document();
    if (doc < 0) throw std::invalid_argument("fill_global_batch: a document of negative length");
    if (doc == 0) return sequences;
    for (int64_t offset = 0, piece = 0; offset < doc; offset += piece) {
      piece = sequence_length_at(doc, offset, context);
      if (total + piece > global_batch_tokens) return sequences;
      sequences.push_back(piece);
      total += piece;
    }
  }
}

// The sequences of one global batch drawn from a built-in distribution.
std::vector<int64_t> sample_global_batch(const LengthDistribution& distribution, int64_t context,
                                         int64_t global_batch_tokens, uint64_t seed);

// Document lengths from a text file: one positive integer per line; blank lines
// and lines starting with '#' are skipped. Throws LengthsInputError naming
// file:line.
std::vector<int64_t> read_length_file(const std::string& path);

// The sequences of the first global batch the trainer's sampler would take from
// an HDF5 token dataset (data/sampler.h: documents in the seeded shuffled order
// of epoch 0, cut at `context`, running on into later epochs if the dataset is
// smaller than a batch). Throws DatasetError for a bad dataset.
std::vector<int64_t> dataset_global_batch(const std::string& path, int64_t context, int64_t global_batch_tokens,
                                          uint64_t seed);

// Token-share statistics of a set of lengths: the fraction of tokens in lengths
// > threshold (or >= with inclusive), and the fraction of lengths <= threshold.
double token_share_above(std::span<const int64_t> lengths, int64_t threshold, bool inclusive = false);
double fraction_at_most(std::span<const int64_t> lengths, int64_t threshold);

}  // namespace hdp
