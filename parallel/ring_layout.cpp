#include "parallel/ring_layout.h"

#include "parallel/plan.h"

namespace hdp {

int64_t RingLayout::rows(int member) const {
  int64_t n = 0;
  for (const RingChunk& c : chunks[member]) n += c.rows;
  return n;
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

}  // namespace hdp
