#pragma once
// `trainer make-corpus --output DATA.h5 [--documents N] [--seed S] [--max-length L]
// [--min-length L] [--median-length L]`: a built-in, deterministic synthetic
// corpus that a small byte-level LLaMA can learn, with a long-tailed document
// length distribution like real pre-training data.
//
// Text: an English-like language over a fixed vocabulary with a small
// probabilistic grammar. Story documents follow two main characters of a
// fixed cast whose facts never change ("Clara lives in Dunmore.", "Clara works
// as a painter."), with topic-dependent nouns, Zipf-weighted word choice,
// quotes and questions with their answers; worksheets hold correct arithmetic
// ("17 + 25 = 42.", "6 times 7 is 42."); inventories count up ("3. four
// lamps"). Byte unigram entropy is about 4.8 bits; a model that learns the
// grammar, facts and arithmetic gets far lower.
//
// Lengths (bytes of text; each document then gets EOS): a log-normal with the
// given median (default 300) and sigma of ln(length) (default 1.3), truncated
// to [min_length, max_length] by resampling: most documents are a few hundred
// bytes, about 1.5% exceed 4 KiB, the tail reaches max_length. Sampled with
// integer arithmetic only (a 12-uniform Irwin-Hall normal and a tabulated
// 2^x), so a (seed, options) pair gives byte-identical files everywhere.

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace hdp {

struct CorpusOptions {
  int64_t documents = 5000;    // ~3.25 M tokens (mean ~650 bytes) with the default lengths
  uint64_t seed = 1234;
  int64_t max_length = 8192;   // bytes of text per document (EOS not counted)
  int64_t min_length = 16;
  int64_t median_length = 300;
  double length_sigma = 1.3;   // standard deviation of ln(length), before truncation
};

// Throws std::invalid_argument naming the option if the options are unusable.
void validate_corpus_options(const CorpusOptions& options);

// The text length of document `index` (before EOS), in bytes.
int64_t demo_document_length(const CorpusOptions& options, int64_t index);
// The text of document `index` (exactly demo_document_length bytes, ASCII).
std::string generate_demo_document(const CorpusOptions& options, int64_t index);

// Writes the corpus as a byte-level dataset (EOS appended to each document).
// Logs a summary via spdlog.
DatasetBuildStats make_demo_corpus(const CorpusOptions& options, const std::string& output);

}  // namespace hdp
