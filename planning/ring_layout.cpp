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

int64_t zigzag_chunk_begin(int64_t length, int chunk, int ring_size) {
  if (ring_size < 1 || chunk < 0 || chunk > 2 * ring_size || length < 0) {
    throw std::invalid_argument("zigzag_chunk_begin: chunk " + std::to_string(chunk) + " of " +
                                std::to_string(2 * static_cast<int64_t>(ring_size)) + " chunks of a sequence of " +
                                std::to_string(length) + " tokens");
  }
  return static_cast<int64_t>(static_cast<__int128>(length) * chunk / (2 * static_cast<int64_t>(ring_size)));
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

}  // namespace hdp
