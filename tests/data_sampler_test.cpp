// The sequence cut, BatchSampler, materialised micro-batches (whole sequences and
// planned pieces), resumption, prefetcher.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "base/rng.h"
#include "data/dataset.h"
#include "data/materialize.h"
#include "data/prefetcher.h"
#include "data/sampler.h"
#include "test_util.h"

namespace hdp {
namespace {

int32_t token_at(int64_t doc, int64_t pos) { return static_cast<int32_t>((doc * 7 + pos * 3) % 251); }

// 150 documents with a skewed mix of lengths, including empty and length-1 ones.
std::string make_dataset(const std::string& name, std::vector<int64_t>* lengths_out = nullptr) {
  std::string dir = testing::scratch_dir(name);
  std::string path = dir + "/d.h5";
  Rng rng(99);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 150; ++i) {
    uint64_t k = rng.below(10);
    int64_t len = k == 0 ? 0 : k == 1 ? 1 : k < 7 ? rng.range(2, 60) : k < 9 ? rng.range(61, 700) : rng.range(701, 3000);
    lengths.push_back(len);
  }
  lengths[3] = 2500;  // -> 1024, 1024, 452 with max_seq_len 1024
  lengths[4] = 1025;  // -> 1024, 1
  TokenDatasetWriter w(path, 258, "byte-level", 256, 257);
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<uint32_t> doc(lengths[d]);
    for (int64_t p = 0; p < lengths[d]; ++p) doc[p] = token_at(d, p);
    w.append(doc);
  }
  w.finish();
  if (lengths_out) *lengths_out = lengths;
  return path;
}

SamplerOptions options(bool shuffle) {
  SamplerOptions o;
  o.max_seq_len = 1024;
  o.global_batch_tokens = 4096;
  o.shuffle = shuffle;
  o.seed = 5;
  return o;
}

void expect_same_batch(const GlobalBatch& a, const GlobalBatch& b) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  for (size_t i = 0; i < a.sequences.size(); ++i) {
    EXPECT_EQ(a.sequences[i].document, b.sequences[i].document);
    EXPECT_EQ(a.sequences[i].offset, b.sequences[i].offset);
    EXPECT_EQ(a.sequences[i].length, b.sequences[i].length);
  }
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.start, b.start);
  EXPECT_EQ(a.next, b.next);
}

// Checks one batch's internal consistency, and the tokens of its sequences read
// back to back as one micro-batch.
void check_batch(const TokenDataset& dataset, const GlobalBatch& batch, const SamplerOptions& o) {
  int64_t tokens = 0, predictions = 0;
  for (const SequenceSpan& s : batch.sequences) {
    EXPECT_GE(s.length, 1);
    EXPECT_LE(s.length, o.max_seq_len);
    tokens += s.length;
    predictions += s.length - 1;
  }
  EXPECT_EQ(batch.tokens, tokens);
  EXPECT_LE(batch.tokens, o.global_batch_tokens);
  EXPECT_TRUE(batch.local_micro_batches.empty()) << "the sampler leaves placing sequences to a plan";

  const PackedMicroBatch mb = materialize_sequences(dataset_reader(dataset), batch.sequences);
  EXPECT_EQ(mb.num_tokens(), tokens);
  EXPECT_EQ(mb.num_predictions(), predictions);
  ASSERT_EQ(mb.spans.size(), batch.sequences.size());
  ASSERT_EQ(mb.cu_seqlens.size(), mb.spans.size() + 1);
  EXPECT_EQ(mb.cu_seqlens.front(), 0);
  ASSERT_EQ(mb.targets.size(), mb.tokens.size());
  ASSERT_EQ(mb.positions.size(), mb.tokens.size());
  for (size_t i = 0; i < mb.spans.size(); ++i) {
    const SequenceSpan& s = mb.spans[i];
    ASSERT_EQ(s.document, batch.sequences[i].document);
    ASSERT_EQ(s.offset, batch.sequences[i].offset);
    ASSERT_EQ(mb.cu_seqlens[i + 1] - mb.cu_seqlens[i], s.length);
    for (int64_t p = 0; p < s.length; ++p) {
      int64_t row = mb.cu_seqlens[i] + p;
      ASSERT_EQ(mb.tokens[row], token_at(s.document, s.offset + p));
      ASSERT_EQ(mb.positions[row], p);
      ASSERT_EQ(mb.targets[row], p + 1 < s.length ? token_at(s.document, s.offset + p + 1) : -1);
    }
  }
}

TEST(DataSequences, DocumentsAreCutAtMaxSeqLen) {
  EXPECT_EQ(sequence_length_at(2500, 0, 1024), 1024);
  EXPECT_EQ(sequence_length_at(2500, 1024, 1024), 1024);
  EXPECT_EQ(sequence_length_at(2500, 2048, 1024), 452);
  EXPECT_EQ(sequence_length_at(1025, 1024, 1024), 1);
  EXPECT_EQ(sequence_length_at(7, 0, 1024), 7);
  EXPECT_THROW(sequence_length_at(2500, 2500, 1024), std::invalid_argument);
  EXPECT_THROW(sequence_length_at(2500, -1, 1024), std::invalid_argument);
  EXPECT_THROW(sequence_length_at(2500, 0, 0), std::invalid_argument);
  const std::vector<SequenceSpan> spans = {{3, 0, 1024}, {3, 1024, 452}, {9, 0, 7}};
  EXPECT_EQ(sequence_lengths(spans), (std::vector<int64_t>{1024, 452, 7}));
}

TEST(DataSampler, OptionValidationNamesTheOption) {
  std::string path = make_dataset("data_sampler_opts");
  TokenDataset ds(path);
  auto message = [&](SamplerOptions o) -> std::string {
    try {
      BatchSampler s(ds, o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  SamplerOptions o = options(false);
  o.global_batch_tokens = 512;
  EXPECT_NE(message(o).find("global_batch_tokens"), std::string::npos) << message(o);
  o = options(false);
  o.max_seq_len = 0;
  EXPECT_NE(message(o).find("max_seq_len"), std::string::npos) << message(o);
  EXPECT_THROW(BatchSampler(ds, options(false), SamplerState{0, 151, 0}), std::invalid_argument);
  EXPECT_THROW(BatchSampler(ds, options(false), SamplerState{0, 3, 2500}), std::invalid_argument);
}

TEST(DataSampler, DocumentOrderIsPortableAndSeeded) {
  std::vector<int64_t> plain = document_order(6, false, 1, 3);
  EXPECT_EQ(plain, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  std::vector<int64_t> e0 = document_order(1000, true, 42, 0), e1 = document_order(1000, true, 42, 1);
  EXPECT_EQ(e0, document_order(1000, true, 42, 0));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, document_order(1000, true, 43, 0));
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  // Pinned: the PRNG and Fisher-Yates are our own, so this holds on every platform.
  EXPECT_EQ(document_order(8, true, 1234, 0), (std::vector<int64_t>{7, 5, 2, 1, 0, 3, 4, 6}));
}

TEST(DataSampler, MaterializedMicroBatchFields) {
  std::string path = make_dataset("data_sampler_mat");
  TokenDataset ds(path);
  std::vector<SequenceSpan> spans = {{3, 1024, 3}, {5, 0, 1}, {3, 0, 2}};
  PackedMicroBatch mb = materialize_sequences(dataset_reader(ds), spans);
  auto t = [](int64_t d, int64_t p) { return token_at(d, p); };
  EXPECT_EQ(mb.tokens, (std::vector<int32_t>{t(3, 1024), t(3, 1025), t(3, 1026), t(5, 0), t(3, 0), t(3, 1)}));
  EXPECT_EQ(mb.targets, (std::vector<int32_t>{t(3, 1025), t(3, 1026), -1, -1, t(3, 1), -1}));
  EXPECT_EQ(mb.positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 1}));
  EXPECT_EQ(mb.cu_seqlens, (std::vector<int32_t>{0, 3, 4, 6}));
  EXPECT_EQ(mb.num_predictions(), 3);
}

TEST(DataSampler, MaterializedRankWorkReadsOnlyItsPieces) {
  std::string path = make_dataset("data_sampler_rank_work");
  TokenDataset ds(path);
  // Sequences 0 (document 3 from 1024, 10 tokens) and 1 (document 3 from 0, 4 tokens).
  const std::vector<SequenceSpan> sequences = {{3, 1024, 10}, {3, 0, 4}};
  RankMicroBatch local;
  local.planned.pieces = {{1, 0, 4, -1}};
  RankMicroBatch ring;
  ring.planned.ring = 0;
  ring.planned.offload_ratio = 0.5;
  ring.planned.pieces = {{1, 0, 4, -1}, {0, 0, 2, 0}, {0, 7, 3, 0}};
  ring.ring_layout = zigzag_ring_layout(std::vector<int>{0, 1}, std::vector<int64_t>{10}, 0);
  std::vector<std::tuple<int64_t, int64_t, int64_t>> reads;
  auto read = [&](int64_t document, int64_t offset, int64_t length, int32_t* out) {
    reads.emplace_back(document, offset, length);
    for (int64_t i = 0; i < length; ++i) out[i] = token_at(document, offset + i);
  };
  const std::vector<RankMicroBatch> work = {local, ring};
  const std::vector<PackedMicroBatch> mbs = materialize_rank_work(read, sequences, work);
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(mbs[0].ring, -1);
  EXPECT_EQ(mbs[0].cu_seqlens, (std::vector<int32_t>{0, 4}));
  const PackedMicroBatch& mb = mbs[1];
  auto t = [](int64_t p) { return token_at(3, p); };
  EXPECT_EQ(mb.tokens, (std::vector<int32_t>{t(0), t(1), t(2), t(3), t(1024), t(1025), t(1031), t(1032), t(1033)}));
  // The ring chunk [0, 2) predicts token 2, which another member holds; the sequence's last token nothing.
  EXPECT_EQ(mb.targets, (std::vector<int32_t>{t(1), t(2), t(3), -1, t(1025), t(1026), t(1032), t(1033), -1}));
  EXPECT_EQ(mb.positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 7, 8, 9}));
  EXPECT_EQ(mb.cu_seqlens, (std::vector<int32_t>{0, 4}));  // whole sequences only; ring rows follow
  EXPECT_EQ(mb.ring, 0);
  EXPECT_EQ(mb.offload_ratio, 0.5);
  EXPECT_EQ(mb.ring_layout.peers, (std::vector<int>{0, 1}));
  EXPECT_EQ(mb.ring_layout.rows(0), 5);
  // Per piece its tokens, and the one token after a piece whose sequence goes on.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> expected = {
      {3, 0, 4}, {3, 0, 4}, {3, 1024, 2}, {3, 1026, 1}, {3, 1031, 3}};
  EXPECT_EQ(reads, expected);
  RankMicroBatch outside;
  outside.planned.pieces = {{0, 8, 3, -1}};
  EXPECT_THROW(materialize_rank_work(read, sequences, std::vector<RankMicroBatch>{outside}), std::invalid_argument);
}

// Draws batches (checking each) until `tokens` tokens were seen; returns their sequences in stream order.
std::vector<SequenceSpan> stream_prefix(BatchSampler& sampler, int64_t tokens, const SamplerOptions& o,
                                        int64_t* batches = nullptr) {
  std::vector<SequenceSpan> out;
  int64_t seen = 0, n = 0;
  GlobalBatch prev;
  bool have_prev = false;
  while (seen < tokens) {
    GlobalBatch b = sampler.next();
    check_batch(sampler.dataset(), b, o);
    if (have_prev) {
      EXPECT_EQ(b.start, prev.next);
      // Batches are maximal: the first sequence of this batch did not fit into the previous one.
      EXPECT_GT(prev.tokens + b.sequences.front().length, o.global_batch_tokens);
    }
    for (const SequenceSpan& s : b.sequences) {
      out.push_back(s);
      seen += s.length;
    }
    prev = std::move(b);
    have_prev = true;
    ++n;
  }
  if (batches) *batches = n;
  return out;
}

void check_epoch_coverage(const std::vector<SequenceSpan>& seqs, const std::vector<int64_t>& lengths, size_t begin,
                          int64_t max_seq_len, std::vector<int64_t>* doc_order) {
  // From `begin`, the next sum(lengths) tokens cover every document exactly once, in
  // consecutive pieces of at most max_seq_len (all full except each document's last).
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  std::map<int64_t, int64_t> covered;  // document -> tokens covered so far
  int64_t seen = 0;
  for (size_t i = begin; seen < total; ++i) {
    ASSERT_LT(i, seqs.size());
    const SequenceSpan& s = seqs[i];
    int64_t& c = covered[s.document];
    ASSERT_EQ(s.offset, c) << "document " << s.document << " pieces in order, no gap or overlap";
    if (c == 0) doc_order->push_back(s.document);
    c += s.length;
    ASSERT_LE(c, lengths[s.document]);
    if (c < lengths[s.document]) {
      ASSERT_EQ(s.length, max_seq_len);
    }
    seen += s.length;
  }
  EXPECT_EQ(seen, total);
  for (size_t d = 0; d < lengths.size(); ++d) EXPECT_EQ(covered[d], lengths[d]) << "document " << d;
}

TEST(DataSampler, EveryTokenOncePerEpochInFileOrder) {
  std::vector<int64_t> lengths;
  std::string path = make_dataset("data_sampler_epoch", &lengths);
  TokenDataset ds(path);
  SamplerOptions o = options(false);
  BatchSampler sampler(ds, o);
  std::vector<SequenceSpan> seqs = stream_prefix(sampler, 2 * ds.num_tokens() + 1, o);
  std::vector<int64_t> order0, order1, expected;
  check_epoch_coverage(seqs, lengths, 0, o.max_seq_len, &order0);
  for (size_t d = 0; d < lengths.size(); ++d)
    if (lengths[d] > 0) expected.push_back(d);
  EXPECT_EQ(order0, expected) << "file order without shuffle";
  // Epoch 1 starts right after epoch 0's last piece and again covers everything.
  int64_t n0 = 0;
  size_t i = 0;
  for (; n0 < ds.num_tokens(); ++i) n0 += seqs[i].length;
  check_epoch_coverage(seqs, lengths, i, o.max_seq_len, &order1);
  EXPECT_EQ(order1, expected);
  // Splitting: 2500 -> 1024, 1024, 452; 1025 -> 1024, 1 (length-1 pieces are kept).
  std::vector<int64_t> pieces3, pieces4;
  for (size_t k = 0; k < i; ++k) {
    if (seqs[k].document == 3) pieces3.push_back(seqs[k].length);
    if (seqs[k].document == 4) pieces4.push_back(seqs[k].length);
  }
  EXPECT_EQ(pieces3, (std::vector<int64_t>{1024, 1024, 452}));
  EXPECT_EQ(pieces4, (std::vector<int64_t>{1024, 1}));
}

TEST(DataSampler, EveryTokenOncePerEpochShuffled) {
  std::vector<int64_t> lengths;
  std::string path = make_dataset("data_sampler_shuffle", &lengths);
  TokenDataset ds(path);
  SamplerOptions o = options(true);
  BatchSampler sampler(ds, o);
  std::vector<SequenceSpan> seqs = stream_prefix(sampler, 2 * ds.num_tokens() + 1, o);
  std::vector<int64_t> order0, order1;
  check_epoch_coverage(seqs, lengths, 0, o.max_seq_len, &order0);
  int64_t n0 = 0;
  size_t i = 0;
  for (; n0 < ds.num_tokens(); ++i) n0 += seqs[i].length;
  check_epoch_coverage(seqs, lengths, i, o.max_seq_len, &order1);
  auto expected_order = [&](uint64_t epoch) {
    std::vector<int64_t> out;
    for (int64_t d : document_order(ds.num_documents(), true, o.seed, epoch))
      if (lengths[d] > 0) out.push_back(d);
    return out;
  };
  EXPECT_EQ(order0, expected_order(0));
  EXPECT_EQ(order1, expected_order(1));
  EXPECT_NE(order0, order1);
}

TEST(DataSampler, SmallBudgetsAndSingleTokenBatches) {
  std::string path = make_dataset("data_sampler_small");
  TokenDataset ds(path);
  SamplerOptions o;
  o.max_seq_len = 16;
  o.global_batch_tokens = 40;
  o.shuffle = true;
  BatchSampler sampler(ds, o);
  for (int i = 0; i < 300; ++i) check_batch(ds, sampler.next(), o);
}

TEST(DataSampler, ResumeFromStateReproducesBatches) {
  std::string path = make_dataset("data_sampler_resume");
  TokenDataset ds(path);
  for (bool shuffle : {false, true}) {
    SamplerOptions o = options(shuffle);
    o.global_batch_tokens = 6000;
    BatchSampler sampler(ds, o);
    std::vector<GlobalBatch> run;
    // Long enough to cross at least two epoch boundaries.
    while (run.empty() || run.back().next.epoch < 2) run.push_back(sampler.next());
    ASSERT_GT(run.size(), 10u);
    // The first start state is epoch 0, already moved past leading empty documents.
    EXPECT_EQ(run.front().start.epoch, 0u);
    EXPECT_EQ(run.front().start.document_offset, 0);
    for (size_t k = 0; k + 1 < run.size(); ++k) {
      BatchSampler resumed(ds, o, run[k].next);
      GlobalBatch again = resumed.next();
      expect_same_batch(again, run[k + 1]);
      if (k + 2 < run.size()) expect_same_batch(resumed.next(), run[k + 2]);
    }
    // A sampler built from a batch's start state is at that batch.
    BatchSampler at_start(ds, o, run[3].start);
    expect_same_batch(at_start.next(), run[3]);
    EXPECT_EQ(at_start.state(), run[3].next);
  }
}

TEST(DataSampler, RejectsDatasetWithoutTokens) {
  std::string dir = testing::scratch_dir("data_sampler_empty");
  TokenDatasetWriter w(dir + "/e.h5", 258, "byte-level", 256, 257);
  w.append(std::vector<uint32_t>{});
  w.finish();
  TokenDataset ds(dir + "/e.h5");
  // A bad input file (the trainer exits with code 2 naming it), not a bad call.
  EXPECT_THROW(BatchSampler(ds, options(false)), DatasetError);
}

TEST(DataPrefetcher, SameBatchesAsSampler) {
  std::string path = make_dataset("data_prefetch_same");
  TokenDataset ds(path);
  SamplerOptions o = options(true);
  BatchSampler direct(ds, o), produced(ds, o);
  BatchPrefetcher prefetcher([&produced] { return produced.next(); }, 2);
  for (int i = 0; i < 40; ++i) expect_same_batch(prefetcher.next(), direct.next());
}

TEST(DataPrefetcher, RethrowsProducerErrorsAfterEarlierBatches) {
  int produced = 0;
  BatchPrefetcher prefetcher(
      [&produced]() -> GlobalBatch {
        if (produced == 3) throw std::runtime_error("disk on fire");
        GlobalBatch b;
        b.tokens = ++produced;
        return b;
      },
      2);
  EXPECT_EQ(prefetcher.next().tokens, 1);
  EXPECT_EQ(prefetcher.next().tokens, 2);
  EXPECT_EQ(prefetcher.next().tokens, 3);
  try {
    prefetcher.next();
    FAIL() << "expected the producer's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk on fire");
  }
  EXPECT_THROW(prefetcher.next(), std::runtime_error);  // stays failed
}

TEST(DataPrefetcher, DestructorDoesNotHang) {
  std::string path = make_dataset("data_prefetch_stop");
  TokenDataset ds(path);
  for (int depth : {1, 2, 4}) {
    BatchSampler sampler(ds, options(false));
    BatchPrefetcher p([&sampler] { return sampler.next(); }, depth);
    if (depth == 2) p.next();
  }  // destroyed with a full queue / mid-production
  SUCCEED();
}

}  // namespace
}  // namespace hdp
