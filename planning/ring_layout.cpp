#include "planning/ring_layout.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace hdp {

int64_t RingLayout::rows(int member) const {
  int64_t n = 0;
  for (const RingChunk& c : chunks[member]) n += c.rows;
  return n;
}

void throw_outside_zigzag_chunks(int64_t length, int chunk, int ring_size) {
  throw std::invalid_argument("zigzag_chunk_begin: chunk " + std::to_string(chunk) + " of " +
                              std::to_string(2 * static_cast<int64_t>(ring_size)) + " chunks of a sequence of " +
                              std::to_string(length) + " tokens");
}

void zigzag_chunk_bounds(int64_t length, int ring_size, std::vector<int64_t>& bounds) {
  if (ring_size < 1 || length < 0) throw_outside_zigzag_chunks(length, 0, ring_size);
  const int64_t chunks = 2 * static_cast<int64_t>(ring_size);
  const int64_t step = length / chunks, carry = length % chunks;
  bounds.resize(static_cast<size_t>(chunks) + 1);
  int64_t begin = 0, remainder = 0;  // floor(length c / chunks) and length c mod chunks
  for (int64_t& b : bounds) {
    b = begin;
    begin += step;
    remainder += carry;
    if (remainder >= chunks) ++begin, remainder -= chunks;
  }
}

RingLayout zigzag_ring_layout(std::span<const int> peers, std::span<const int64_t> sequence_lengths, int self) {
  RingLayout ring;
  ring.peers.assign(peers.begin(), peers.end());
  ring.self = self;
  const int k = static_cast<int>(peers.size());
  ring.chunks.resize(k);
  for (int member = 0; member < k; ++member) {
    for (size_t s = 0; s < sequence_lengths.size(); ++s) {
      for (int chunk : {member, 2 * k - 1 - member}) {
        const int64_t begin = zigzag_chunk_begin(sequence_lengths[s], chunk, k);
        const int64_t end = zigzag_chunk_begin(sequence_lengths[s], chunk + 1, k);
        if (end > begin) ring.chunks[member].push_back({end - begin, begin, static_cast<int64_t>(s)});
      }
    }
  }
  return ring;
}

void key_rows_needed(const RingLayout& ring, int source, int receiver, int64_t window, std::vector<ChunkRows>& runs) {
  runs.clear();
  for (const RingChunk& key : ring.chunks[source]) {
    // Positions [lo, hi] of the key chunk that some query of the receiver sees.
    int64_t lo = key.position + key.rows, hi = key.position - 1;
    for (const RingChunk& query : ring.chunks[receiver]) {
      if (query.sequence != key.sequence || query.rows == 0) continue;
      const int64_t last_query = query.position + query.rows - 1;
      const int64_t first = window > 0 ? std::max(key.position, query.position - window + 1) : key.position;
      const int64_t last = std::min(key.position + key.rows - 1, last_query);
      if (first > last) continue;
      lo = std::min(lo, first);
      hi = std::max(hi, last);
    }
    runs.push_back(lo <= hi ? ChunkRows{lo - key.position, hi + 1 - key.position} : ChunkRows{key.rows, key.rows});
  }
}

int64_t total_rows(std::span<const ChunkRows> runs) {
  int64_t n = 0;
  for (const ChunkRows& r : runs) n += r.rows();
  return n;
}

namespace {

// One sequence's chunk boundaries in a ring of n members: chunk c is rows
// [bounds[c], bounds[c + 1]); `holders` are the members with a non-empty chunk.
struct SequenceChunks {
  std::vector<int64_t> bounds;
  std::vector<int> holders;
};

SequenceChunks sequence_chunks(int64_t length, int n) {
  SequenceChunks s;
  s.bounds.resize(2 * static_cast<size_t>(n) + 1);
  zigzag_chunk_bounds(length, n, s.bounds);
  for (int m = 0; m < n; ++m)
    if (s.bounds[m + 1] > s.bounds[m] || s.bounds[2 * n - m] > s.bounds[2 * n - 1 - m]) s.holders.push_back(m);
  return s;
}

// key_rows_needed's count for one sequence: the rows of member q's chunks that
// member p reads. A key chunk c is read from its first row (or, under a window,
// from W - 1 rows before the start of p's nearest later chunk) to its end when p
// holds a later non-empty chunk of the sequence; chunks never overlap, so earlier
// query chunks see none of it and the nearest later one sees the most.
int64_t rows_read(const SequenceChunks& s, int n, int64_t window, int q, int p) {
  const int low = p, high = 2 * n - 1 - p;
  auto held = [&](int c) { return s.bounds[c + 1] > s.bounds[c]; };
  int64_t rows = 0;
  for (int c : {q, 2 * n - 1 - q}) {
    if (!held(c)) continue;
    const int nearest = low > c && held(low) ? low : high > c && held(high) ? high : -1;
    if (nearest < 0) continue;
    const int64_t first = window > 0 ? std::max(s.bounds[c], s.bounds[nearest] - window + 1) : s.bounds[c];
    rows += std::max<int64_t>(0, s.bounds[c + 1] - first);
  }
  return rows;
}

}  // namespace

RingStepRows ring_step_rows(std::span<const int64_t> lengths, int n, int64_t window) {
  if (n < 0) throw std::invalid_argument("ring_step_rows: a ring of " + std::to_string(n) + " members");
  RingStepRows out;
  out.most.assign(n, 0);
  if (n == 0) return out;  // no member reads anything
  const size_t members = static_cast<size_t>(n);
  auto uncut = [&](int64_t length) { return window <= 0 || window >= length; };
  // A sequence of at least 2n rows that no window cuts gives every member both
  // chunks and every chunk is read whole by everyone holding a later one: member p
  // reads source q's first chunk always and its second when p < q. Their rows add
  // up over such sequences per source.
  std::vector<int64_t> first_rows(members, 0), second_rows(members, 0);
  // A shorter one that no window cuts has chunks of one row or none (2n chunks over
  // fewer rows), and rows_read reduces to which chunks hold a row: a reader p holding
  // its second chunk (2n - 1 - p, later than every first chunk) reads q's first chunk
  // and q's second when q > p; a reader holding only its first chunk p reads q's first
  // chunk when q < p. Per member, bit j of its words says so of the j-th such
  // sequence: what p reads from q is then the popcount of two words' AND, n^2 x
  // words in all, where pairs of holders cost the square of each sequence's length
  // (static's rings at 12,288 GPUs: hundreds of such sequences over 768 members).
  const size_t short_ones = static_cast<size_t>(std::count_if(lengths.begin(), lengths.end(), [&](int64_t length) {
    return length < 2 * static_cast<int64_t>(n) && uncut(length);
  }));
  const size_t words = (short_ones + 63) / 64;
  // Per member m at m x words: first chunk holds a row; second does; reader holds its
  // second chunk; reader holds its first chunk only.
  std::vector<uint64_t> first_held(members * words, 0), second_held(members * words, 0);
  std::vector<uint64_t> reads_all(members * words, 0), reads_earlier(members * words, 0);
  // The rest (cut by the window) by pairs of holders: by reader p and step t at p x n
  // + t (a reader's steps side by side, as the loops below walk one reader's sources).
  std::vector<int64_t> cut_read;
  std::vector<int64_t> bounds;
  size_t bit = 0;
  for (int64_t length : lengths) {
    const bool cut = !uncut(length);
    if (length >= 2 * static_cast<int64_t>(n) && !cut) {
      zigzag_chunk_bounds(length, n, bounds);
      for (int q = 0; q < n; ++q) {
        first_rows[q] += bounds[q + 1] - bounds[q];
        second_rows[q] += bounds[2 * n - q] - bounds[2 * n - 1 - q];
      }
      continue;
    }
    const SequenceChunks s = sequence_chunks(length, n);
    if (!cut) {
      const size_t word = bit / 64;
      const uint64_t mask = uint64_t{1} << (bit % 64);
      ++bit;
      for (int m : s.holders) {
        const bool first = s.bounds[m + 1] > s.bounds[m], second = s.bounds[2 * n - m] > s.bounds[2 * n - 1 - m];
        const size_t at = static_cast<size_t>(m) * words + word;
        if (first) first_held[at] |= mask;
        if (second) second_held[at] |= mask, reads_all[at] |= mask;
        else reads_earlier[at] |= mask;
      }
      continue;
    }
    if (cut_read.empty()) cut_read.assign(members * members, 0);
    for (int q : s.holders)
      for (int p : s.holders)
        if (p != q) cut_read[static_cast<size_t>(p) * members + (p >= q ? p - q : p - q + n)] += rows_read(s, n, window, q, p);
  }
  // Only sequences of 2n rows or more, uncut: at step t a reader p >= t reads first
  // chunks of q = p - t in [0, n - 1 - t], a reader p < t both chunks of q = p - t + n in
  // [n - t, n - 1], so the step's most and sum are a prefix's and a suffix's (O(n),
  // where the readers one by one cost n^2: balance's rings of hundreds of members).
  if (words == 0 && cut_read.empty()) {
    std::vector<int64_t> prefix_most(members), prefix_sum(members), suffix_most(members), suffix_sum(members);
    for (int q = 0; q < n; ++q) {
      prefix_most[q] = std::max(q > 0 ? prefix_most[q - 1] : 0, first_rows[q]);
      prefix_sum[q] = (q > 0 ? prefix_sum[q - 1] : 0) + first_rows[q];
    }
    for (int q = n - 1; q >= 0; --q) {
      const int64_t both = first_rows[q] + second_rows[q];
      suffix_most[q] = std::max(q + 1 < n ? suffix_most[q + 1] : 0, both);
      suffix_sum[q] = (q + 1 < n ? suffix_sum[q + 1] : 0) + both;
    }
    for (int t = 1; t < n; ++t) {
      out.most[t] = std::max(prefix_most[n - 1 - t], suffix_most[n - t]);
      out.total += prefix_sum[n - 1 - t] + suffix_sum[n - t];
    }
    return out;
  }
  auto common = [&](const std::vector<uint64_t>& reader_bits, int p, const std::vector<uint64_t>& source_bits, int q) {
    int64_t rows = 0;
    const uint64_t* a = reader_bits.data() + static_cast<size_t>(p) * words;
    const uint64_t* b = source_bits.data() + static_cast<size_t>(q) * words;
    for (size_t w = 0; w < words; ++w) rows += std::popcount(a[w] & b[w]);
    return rows;
  };
  // Reader by reader (its words and its row of cut_read stay in cache; its sources q =
  // p - t run down as t runs up).
  for (int p = 0; p < n; ++p)
    for (int t = 1; t < n; ++t) {
      const int q = p >= t ? p - t : p - t + n;  // q > p exactly when p < t
      int64_t read = first_rows[q] + (p < t ? second_rows[q] : 0);
      if (words > 0)
        read += common(reads_all, p, first_held, q) +
                (p < t ? common(reads_all, p, second_held, q) : common(reads_earlier, p, first_held, q));
      if (!cut_read.empty()) read += cut_read[static_cast<size_t>(p) * members + t];
      out.most[t] = std::max(out.most[t], read);
      out.total += read;
    }
  return out;
}

}  // namespace hdp
