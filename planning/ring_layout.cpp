#include "planning/ring_layout.h"

#include <algorithm>
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
  for (int c = 0; c <= 2 * n; ++c) s.bounds[c] = zigzag_chunk_begin(length, c, n);
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
  // A sequence of at least 2n rows that no window cuts gives every member both
  // chunks and every chunk is read whole by everyone holding a later one: member p
  // reads source q's first chunk always and its second when p < q. Their rows add
  // up over such sequences per source; the others are counted one by one.
  std::vector<int64_t> first_rows(n, 0), second_rows(n, 0);
  std::vector<SequenceChunks> others;  // cut by the window, or shorter than 2n
  for (int64_t length : lengths) {
    if (length >= 2 * static_cast<int64_t>(n) && (window <= 0 || window >= length)) {
      const SequenceChunks s = sequence_chunks(length, n);
      for (int q = 0; q < n; ++q) {
        first_rows[q] += s.bounds[q + 1] - s.bounds[q];
        second_rows[q] += s.bounds[2 * n - q] - s.bounds[2 * n - 1 - q];
      }
    } else {
      others.push_back(sequence_chunks(length, n));
    }
  }
  // The others' rows, by reader p and step t at p x n + t (a reader's steps side by
  // side: the loops below walk one reader's sources, whose steps are consecutive): only
  // members holding a chunk read or are read, so pairs of holders (fewer than n x
  // holders when a short sequence leaves members without a row).
  // Without a window, rows_read reduces to the chunks' sizes: a reader p holding its
  // second chunk (2n - 1 - p, later than every first chunk) reads q's first chunk
  // whole and q's second when q > p; a reader holding only its first chunk p reads
  // q's first chunk when q < p; a sequence of static's rings at 12,288 GPUs has
  // tens of thousands of such pairs.
  std::vector<int64_t> others_read(others.empty() ? 0 : static_cast<size_t>(n) * n, 0);
  std::vector<int64_t> first_size(n), second_size(n);
  for (const SequenceChunks& s : others) {
    auto at = [&](int q, int p) -> int64_t& {
      return others_read[static_cast<size_t>(p) * n + (p >= q ? p - q : p - q + n)];
    };
    if (window > 0 && window < s.bounds.back()) {  // cut by the window (bounds.back(): its length)
      for (int q : s.holders)
        for (int p : s.holders)
          if (p != q) at(q, p) += rows_read(s, n, window, q, p);
      continue;
    }
    for (int m : s.holders) {
      first_size[m] = s.bounds[m + 1] - s.bounds[m];
      second_size[m] = s.bounds[2 * n - m] - s.bounds[2 * n - 1 - m];
    }
    for (int p : s.holders) {
      if (second_size[p] > 0) {
        for (int q : s.holders)
          if (q != p) at(q, p) += first_size[q] + (q > p ? second_size[q] : 0);
      } else {
        for (int q : s.holders) {
          if (q >= p) break;  // holders ascend
          at(q, p) += first_size[q];
        }
      }
    }
  }
  std::vector<int64_t> read(n);
  for (int t = 1; t < n; ++t) {
    for (int p = 0; p < n; ++p) {
      const int q = p >= t ? p - t : p - t + n;  // q > p exactly when p < t
      read[p] = first_rows[q] + (p < t ? second_rows[q] : 0);
      if (!others.empty()) read[p] += others_read[static_cast<size_t>(p) * n + t];
    }
    for (int p = 0; p < n; ++p) {
      out.most[t] = std::max(out.most[t], read[p]);
      out.total += read[p];
    }
  }
  return out;
}

}  // namespace hdp
