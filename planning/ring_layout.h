#pragma once
// Which rows of a ring micro-batch each member holds: the zig-zag chunks of the
// ring's sequences with their true positions (planning/plan.h).

#include <cstdint>
#include <span>
#include <vector>

namespace hdp {

// A chunk of a ring sequence as one member holds it: `rows` consecutive rows
// whose first token sits at `position` of ring sequence `sequence`.
struct RingChunk {
  int64_t rows = 0;
  int64_t position = 0;
  int64_t sequence = 0;
};

// One micro-batch's ring, as every member sees it.
struct RingLayout {
  std::vector<int> peers;                      // hdp ranks of the members, in ring order
  std::vector<std::vector<RingChunk>> chunks;  // per member: its ring rows in row order
  int self = 0;                                // this rank's position in the ring
  int64_t rows(int member) const;
};

// Chunk c of 2k zig-zag chunks of a sequence of `length` tokens starts here:
// chunks are [length * c / 2k, length * (c + 1) / 2k). Throws std::invalid_argument
// for a chunk outside [0, 2k] or k < 1.
[[noreturn]] void throw_outside_zigzag_chunks(int64_t length, int chunk, int ring_size);
// Inline: the planner, the simulator and check_plan call it for every chunk of every
// ring member (millions of times for a static plan at 12,288 GPUs).
inline int64_t zigzag_chunk_begin(int64_t length, int chunk, int ring_size) {
  if (ring_size < 1 || chunk < 0 || chunk > 2 * ring_size || length < 0)
    throw_outside_zigzag_chunks(length, chunk, ring_size);
  // chunk <= 2 ring_size < 2^32: below 2^31 tokens the product fits 64 bits, and the
  // 128-bit division (a library call) is the planner's and check_plan's hot spot.
  const int64_t chunks = 2 * static_cast<int64_t>(ring_size);
  if (length < (int64_t{1} << 31)) return length * chunk / chunks;
  return static_cast<int64_t>(static_cast<__int128>(length) * chunk / chunks);
}

// All 2k + 1 chunk starts of a sequence at once, bounds[c] = zigzag_chunk_begin(length,
// c, k) for c in [0, 2k]: by adding length / 2k and carrying the remainder, without a
// division per chunk (static's plans at 12,288 GPUs cut every sequence into 1,536
// chunks). `bounds` is resized to 2k + 1. Throws as zigzag_chunk_begin for k < 1.
void zigzag_chunk_bounds(int64_t length, int ring_size, std::vector<int64_t>& bounds);

// The layout of a ring over sequences of these lengths for the member at
// position `self`: member j holds chunks j and 2k-1-j of every sequence, in order.
RingLayout zigzag_ring_layout(std::span<const int> peers, std::span<const int64_t> sequence_lengths, int self);

// A run of rows of one chunk, [begin, end) counted from the chunk's first row.
struct ChunkRows {
  int64_t begin = 0, end = 0;
  int64_t rows() const { return end - begin; }
};

// Of each chunk of member `source`, the rows member `receiver` reads as keys: those
// whose position is at most, and with a sliding window W > 0 more than W below, the
// position of one of the receiver's query rows of the same sequence (kernels/ops.h).
// Chunks of different members never overlap, so it is a suffix of the chunk (the
// receiver's later queries read its last W - 1 rows at most) or nothing; the whole
// chunk without a window. One run per chunk of `source`, in its row order, into
// `runs` (cleared first; its capacity is kept, so a ring step allocates nothing).
void key_rows_needed(const RingLayout& ring, int source, int receiver, int64_t window, std::vector<ChunkRows>& runs);
int64_t total_rows(std::span<const ChunkRows> runs);

// What a zig-zag ring of `ring_size` members over sequences of these lengths sends
// by key_rows_needed's rule, without building its layout: at step t (1 <= t <
// ring_size) member p reads from member p - t (mod ring_size).
struct RingStepRows {
  std::vector<int64_t> most;  // [t], ring_size entries: the most key rows a member reads at step t; most[0] = 0
  int64_t total = 0;          // key rows read by all members over all steps
};
// O(ring_size x sequences) for sequences of at least 2 x ring_size rows that no
// window cuts; plus ring_size^2 x ceil(S / 64) for S shorter ones, and the pairs of
// members holding rows of each sequence the window cuts: the simulator prices rings
// of hundreds of members over hundreds of sequences with it.
RingStepRows ring_step_rows(std::span<const int64_t> sequence_lengths, int ring_size, int64_t window);

}  // namespace hdp
