#pragma once
// Ring attention over the hybrid-data-parallel communicator: the k ranks of a
// ring each hold two zig-zag chunks of every sequence of the ring (with their
// true positions) and compute the attention of their query rows against every
// member's keys in k steps: at step t member p computes against the keys and
// values of member p - t, which member p - t sent it directly during step t - 1
// (overlapping that step's compute), and only the rows p reads: the chunks that are
// not wholly in p's future and, under a sliding window (Mistral: Jiang et al. 2023),
// only their last W - 1 rows (planning/ring_layout.h, key_rows_needed). A step
// with nothing to read sends nothing and computes nothing. Partial results are
// merged with their log-sum-exp; in backward each step's key/value gradients go
// straight back to their owner, who adds them into its rows.
//
// No communicator is made per ring: all rings are point-to-point messages on the
// one hdp communicator of this tp rank and pipeline stage, each step's sends and
// receives posted together as one Communicator::exchange (one NCCL group under NCCL).
//
// bf16 activations (mixed precision, Micikevicius et al. 2018): the rule of the
// project is fp32 statistics and accumulation, bf16 storage, one rounding where a
// bf16 result is stored (kernels/cpu/bf16.cpp). The block ops round their outputs
// once per call, and the ring calls them once per step, so running them on the bf16
// tensors would round the running output, dq and dk/dv k times, and each gradient
// contribution sent back once more. Instead the ring widens q, k, v (and out, dout
// in backward) exactly into fp32 images, runs every step in fp32 (the output, its
// log-sum-exp and all gradients accumulate there), and rounds out, dq, dk and dv once
// at the end: the arithmetic of one process's bf16 attention (widen, fp32, round
// once), up to the order of the fp32 log-sum-exp merge and of the gradient sums.
// The key/value rows travel as bf16 (they are bf16 values: exact, half the bytes of
// fp32) and are widened on arrival; the key/value gradient contributions travel as
// fp32, because they are partial sums that their owner adds.

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"
#include "parallel/communicator.h"
#include "planning/ring_layout.h"

namespace hdp {

class RingAttention {
 public:
  // max_tokens: the most rows of a micro-batch (its local rows and its ring rows
  // together); buffers are sized for it. window: the sliding window of every query
  // (kernels/ops.h), kNoWindow for none. precision: the dtype of the activations
  // (fp32 or bf16), which every call's tensors have.
  RingAttention(Communicator& hdp, int64_t max_tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                int64_t window, DType precision = DType::F32, Device device = Device::CPU);

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
  // pools over its tokens (Mixtral's routing counts, model/moe.cpp).
  void sum_over_members(std::span<float> values, const RingLayout& ring);

  size_t buffer_bytes() const { return arena_.capacity(); }

 private:
  // The ring's steps on fp32 tensors (compute), with the key/value rows sent from
  // `wire_k` / `wire_v` (the caller's tensors, in the activations' dtype).
  void forward_fp32(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& wire_k,
                    const Tensor& wire_v, std::span<const AttentionBlock> local_blocks, const RingLayout& ring,
                    int64_t ring_begin);
  void backward_fp32(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& wire_k, const Tensor& wire_v, const Tensor& out, const Tensor& lse,
                     std::span<const AttentionBlock> local_blocks, const RingLayout& ring, int64_t ring_begin);
  // Checks a call's rows and dtypes against the layout and the buffers.
  void check_call(const char* what, int64_t T, int64_t ring_begin, const RingLayout& ring,
                  std::initializer_list<const Tensor*> activations) const;
  // Blocks of this member's ring query rows against the runs `held` of member
  // `source`'s chunks, packed one after another from row k_offset of the key tensor.
  void ring_blocks(const RingLayout& ring, int source, std::span<const ChunkRows> held, int64_t ring_begin,
                   int64_t k_offset);
  // Posts this step's exchange for the next, as one grouped exchange: the receive of
  // what member p - t sends into `into`, and the send of this member's rows that
  // p + t reads (packed from k and v rows [ring_begin, T)). Either is left out when empty.
  CommRequest post_exchange(const RingLayout& ring, int t, const Tensor& k, const Tensor& v, int64_t ring_begin,
                            const Tensor& into);
  // The `rows` received key/value rows in `buffer` as fp32, for the block ops:
  // the buffer itself in fp32, else their exact widening into kv_f32_.
  Tensor received_fp32(const Tensor& buffer, int64_t rows);
  // [rows, 2, Hkv, d] packed keys and values of a member's ring rows, in the buffer's dtype.
  Tensor keys(const Tensor& packed, int64_t rows) const;
  Tensor values(const Tensor& packed, int64_t rows) const;
  Tensor packed(const Tensor& buffer, int64_t rows) const;
  // The fp32 image buffer `image` shaped as t (bf16), holding t widened exactly
  // when `widen`, else undefined (an output).
  static Tensor image_of(const Tensor& image, const Tensor& t, bool widen);

  Communicator& hdp_;
  int64_t max_tokens_, q_heads_, kv_heads_, head_dim_, window_;
  DType precision_;
  Arena arena_;
  Tensor kv_[2];     // received key/value rows (activation dtype): the ones computed on and the ones arriving
  Tensor send_;      // this member's rows packed for the member they go to (activation dtype)
  Tensor dkv_;       // this step's key/value gradient contribution (fp32), sent back to its owner
  Tensor dkv_back_;  // the gradient of this member's rows coming back from a reader (fp32)
  // bf16 only: the fp32 images the steps compute on (every row of the micro-batch).
  Tensor kv_f32_;                                     // the received rows, widened
  Tensor q_f32_, k_f32_, v_f32_, out_f32_, dout_f32_;  // inputs, widened (out: forward's output)
  Tensor dq_f32_, dk_f32_, dv_f32_;                   // gradients, accumulated in fp32
  std::vector<AttentionBlock> blocks_;
  std::vector<ChunkRows> own_, held_, sent_, back_, incoming_;
  std::vector<float> members_values_;  // sum_over_members: every member's values, in ring order
  std::vector<Transfer> member_sends_, member_receives_;  // and its messages (capacity kept)
};

}  // namespace hdp
