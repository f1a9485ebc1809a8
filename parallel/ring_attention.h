#pragma once
// Ring attention over the hybrid-data-parallel communicator: the k ranks of a
// ring each hold two zig-zag chunks of every sequence of the ring (with their
// true positions) and compute the attention of their query rows against every
// member's keys by passing key/value blocks around the ring. Partial results are
// merged with their log-sum-exp; in backward the key/value gradients travel
// with their blocks and arrive back at their owner after a full turn. Every
// transfer is non-blocking and overlaps the computation of the current block.
//
// No communicator is made per ring: all rings are point-to-point messages on the
// one hdp communicator of this tp rank and pipeline stage.

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
  RingAttention(Communicator& hdp, int64_t max_rows, int64_t kv_heads, int64_t head_dim,
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

  size_t buffer_bytes() const { return arena_.capacity(); }

 private:
  // Blocks of this member's ring query rows against member `source`'s key rows,
  // whose first row is k_offset in the key tensor.
  void ring_blocks(const RingLayout& ring, int source, int64_t ring_begin, int64_t k_offset);
  // [rows, 2, Hkv, d] packed keys and values of a member's ring rows.
  Tensor keys(const Tensor& packed, int64_t rows) const;
  Tensor values(const Tensor& packed, int64_t rows) const;
  Tensor packed(const Tensor& buffer, int64_t rows) const;

  Communicator& hdp_;
  int64_t max_rows_, kv_heads_, head_dim_;
  Arena arena_;
  Tensor kv_[2];      // key/value blocks in flight: the one computed on and the one arriving
  Tensor dkv_[2];     // travelling key/value gradients: the one arriving and the one being sent
  Tensor dkv_local_;  // this step's contribution, computed while the travelling one arrives
  std::vector<AttentionBlock> blocks_;
};

}  // namespace hdp
