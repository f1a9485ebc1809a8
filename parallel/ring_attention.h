#pragma once
// Ring attention over the hybrid-data-parallel communicator: the k ranks of a
// ring each hold two zig-zag chunks of every sequence of the ring (with their
// true positions) and compute the attention of their query rows against every
// member's keys in k steps: at step t member p computes against the keys and
// values of member p - t, which member p - t sent it directly during step t - 1
// (overlapping that step's compute), and only the rows p reads: the chunks that are
// not wholly in p's future and, under a sliding window (Mistral: Jiang et al. 2023),
// only their last W - 1 rows (parallel/ring_layout.h, key_rows_needed). A step
// with nothing to read sends nothing and computes nothing. Partial results are
// merged with their log-sum-exp; in backward each step's key/value gradients go
// straight back to their owner, who adds them into its rows.
//
// No communicator is made per ring: all rings are point-to-point messages on the
// one hdp communicator of this tp rank and pipeline stage, each step's sends and
// receives posted together as one Communicator::exchange (one NCCL group under NCCL).

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/communicator.h"
#include "parallel/ring_layout.h"

namespace hdp {

class RingAttention {
 public:
  // max_rows: the most ring rows any member holds; buffers are sized for it.
  // window: the sliding window of every query (kernels/ops.h), kNoWindow for none.
  RingAttention(Communicator& hdp, int64_t max_rows, int64_t kv_heads, int64_t head_dim, int64_t window,
                Device device = Device::CPU);

  // out [T, Hq, d], lse [Hq, T]: computed for every row. q, k, v are the micro-batch's
  // tensors; rows [ring_begin, T) are this member's ring rows, the rows before are
  // covered by local_blocks (whole local sequences).
  void forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
               std::span<const AttentionBlock> local_blocks, const RingLayout& ring, int64_t ring_begin);
  // Overwrites dq, dk, dv for every row.
  void backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                const Tensor& v, const Tensor& out, const Tensor& lse, std::span<const AttentionBlock> local_blocks,
                const RingLayout& ring, int64_t ring_begin);

  // Sums `values` (host memory, the same length on every member) over the ring's
  // members: every member sends its values to every other and adds all of them in
  // ring order, so all end with the same bits. For the small statistics a forward
  // pools over its tokens (Mixtral's routing counts, model/model.cpp).
  void sum_over_members(std::span<float> values, const RingLayout& ring);

  size_t buffer_bytes() const { return arena_.capacity(); }

 private:
  // Blocks of this member's ring query rows against the runs `held` of member
  // `source`'s chunks, packed one after another from row k_offset of the key tensor.
  void ring_blocks(const RingLayout& ring, int source, std::span<const ChunkRows> held, int64_t ring_begin,
                   int64_t k_offset);
  // Posts this step's exchange for the next, as one grouped exchange: the receive of
  // what member p - t sends into `into`, and the send of this member's rows that
  // p + t reads (packed from k and v rows [ring_begin, T)). Either is left out when empty.
  CommRequest post_exchange(const RingLayout& ring, int t, const Tensor& k, const Tensor& v, int64_t ring_begin,
                            const Tensor& into);
  // [rows, 2, Hkv, d] packed keys and values of a member's ring rows.
  Tensor keys(const Tensor& packed, int64_t rows) const;
  Tensor values(const Tensor& packed, int64_t rows) const;
  Tensor packed(const Tensor& buffer, int64_t rows) const;

  Communicator& hdp_;
  int64_t max_rows_, kv_heads_, head_dim_, window_;
  Arena arena_;
  Tensor kv_[2];     // received key/value rows: the ones computed on and the ones arriving
  Tensor send_;      // this member's rows packed for the member they go to
  Tensor dkv_;       // this step's key/value gradient contribution, sent back to its owner
  Tensor dkv_back_;  // the gradient of this member's rows coming back from a reader
  std::vector<AttentionBlock> blocks_;
  std::vector<ChunkRows> own_, held_, sent_, back_, incoming_;
  std::vector<float> members_values_;  // sum_over_members: every member's values, in ring order
};

}  // namespace hdp
