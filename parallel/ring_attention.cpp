#include "parallel/ring_attention.h"

#include <stdexcept>
#include <string>

#include "parallel/progress.h"

namespace hdp {
namespace {

constexpr int kKeyValueTag = 1001;
constexpr int kGradientTag = 1002;

}  // namespace

RingAttention::RingAttention(Communicator& hdp, int64_t max_rows, int64_t kv_heads, int64_t head_dim, Device device)
    : hdp_(hdp),
      max_rows_(max_rows),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      arena_(Arena::counting(device, "ring attention")) {
  const int64_t block = 2 * max_rows * kv_heads * head_dim;
  auto layout = [&](Arena& a) {
    for (Tensor& t : kv_) t = a.tensor({block});
    for (Tensor& t : dkv_) t = a.tensor({block});
    dkv_local_ = a.tensor({block});
  };
  Arena sizing = Arena::counting(device, "ring attention");
  layout(sizing);
  arena_ = Arena(device, sizing.used(), "ring attention");
  layout(arena_);
}

Tensor RingAttention::packed(const Tensor& buffer, int64_t rows) const {
  return Tensor(buffer.data, {2 * rows * kv_heads_ * head_dim_}, buffer.device);
}

Tensor RingAttention::keys(const Tensor& buffer, int64_t rows) const {
  return Tensor(buffer.data, {rows, kv_heads_, head_dim_}, buffer.device);
}

Tensor RingAttention::values(const Tensor& buffer, int64_t rows) const {
  return Tensor(buffer.data + rows * kv_heads_ * head_dim_, {rows, kv_heads_, head_dim_}, buffer.device);
}

void RingAttention::ring_blocks(const RingLayout& ring, int source, int64_t ring_begin, int64_t k_offset) {
  blocks_.clear();
  int64_t q_row = ring_begin;
  for (const RingChunk& mine : ring.chunks[ring.self]) {
    int64_t k_row = k_offset;
    for (const RingChunk& theirs : ring.chunks[source]) {
      if (theirs.sequence == mine.sequence && theirs.position <= mine.position + mine.rows - 1) {
        blocks_.push_back({static_cast<int32_t>(q_row), static_cast<int32_t>(q_row + mine.rows),
                           static_cast<int32_t>(k_row), static_cast<int32_t>(k_row + theirs.rows),
                           static_cast<int32_t>(mine.position), static_cast<int32_t>(theirs.position)});
      }
      k_row += theirs.rows;
    }
    q_row += mine.rows;
  }
}

void RingAttention::forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            std::span<const AttentionBlock> local_blocks, const RingLayout& ring,
                            int64_t ring_begin) {
  progress::Context context("ring attention forward");
  const int n = static_cast<int>(ring.peers.size()), p = ring.self;
  const int64_t T = q.dim(0), mine = ring.rows(p);
  if (T - ring_begin != mine || mine > max_rows_) {
    throw std::invalid_argument("ring attention: " + std::to_string(T - ring_begin) + " ring rows, the layout says " +
                                std::to_string(mine) + " (buffers hold " + std::to_string(max_rows_) + ")");
  }
  attention_reset_rows(out, lse, 0, T);
  if (!local_blocks.empty()) attention_forward_blocks(out, lse, q, k, v, local_blocks);

  copy(keys(kv_[0], mine), k.rows(ring_begin, T));
  copy(values(kv_[0], mine), v.rows(ring_begin, T));
  const int next = ring.peers[(p + 1) % n], previous = ring.peers[(p + n - 1) % n];
  int current = 0;
  for (int step = 0; step < n; ++step) {
    // At step t this member holds the keys and values of member p - t.
    const int source = (p - step + n) % n;
    const int64_t rows = ring.rows(source);
    CommRequest send, receive;
    if (step + 1 < n) {
      receive = hdp_.recv_async(packed(kv_[1 - current], ring.rows((source + n - 1) % n)), previous, kKeyValueTag);
      send = hdp_.send_async(packed(kv_[current], rows), next, kKeyValueTag);
    }
    ring_blocks(ring, source, ring_begin, 0);
    attention_forward_blocks(out, lse, q, keys(kv_[current], rows), values(kv_[current], rows), blocks_);
    send.wait();
    receive.wait();
    current = 1 - current;
  }
}

void RingAttention::backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             std::span<const AttentionBlock> local_blocks, const RingLayout& ring,
                             int64_t ring_begin) {
  progress::Context context("ring attention backward");
  const int n = static_cast<int>(ring.peers.size()), p = ring.self;
  const int64_t T = q.dim(0), mine = ring.rows(p);
  fill(dq, 0.0f);
  fill(dk, 0.0f);
  fill(dv, 0.0f);
  if (!local_blocks.empty()) attention_backward_blocks(dq, dk, dv, dout, q, k, v, out, lse, local_blocks);

  copy(keys(kv_[0], mine), k.rows(ring_begin, T));
  copy(values(kv_[0], mine), v.rows(ring_begin, T));
  const int next = ring.peers[(p + 1) % n], previous = ring.peers[(p + n - 1) % n];
  int current = 0;
  CommRequest gradient_sends[2];
  for (int step = 0; step < n; ++step) {
    const int source = (p - step + n) % n;
    const int64_t rows = ring.rows(source);
    CommRequest send, receive, incoming;
    if (step + 1 < n) {
      receive = hdp_.recv_async(packed(kv_[1 - current], ring.rows((source + n - 1) % n)), previous, kKeyValueTag);
      send = hdp_.send_async(packed(kv_[current], rows), next, kKeyValueTag);
    }
    // The gradient of block `source` accumulated by the members that held it
    // before arrives while this member computes its own contribution.
    if (step > 0) incoming = hdp_.recv_async(packed(dkv_local_, rows), previous, kGradientTag);
    Tensor& contribution = dkv_[step % 2];
    gradient_sends[step % 2].wait();
    fill(packed(contribution, rows), 0.0f);
    ring_blocks(ring, source, ring_begin, 0);
    attention_backward_blocks(dq, keys(contribution, rows), values(contribution, rows), dout, q,
                              keys(kv_[current], rows), values(kv_[current], rows), out, lse, blocks_);
    if (step > 0) {
      incoming.wait();
      add_inplace(packed(contribution, rows), packed(dkv_local_, rows));
    }
    if (n > 1) gradient_sends[step % 2] = hdp_.send_async(packed(contribution, rows), next, kGradientTag);
    send.wait();
    receive.wait();
    current = 1 - current;
  }
  // After a full turn the gradient of this member's own block comes back complete.
  const Tensor own = n > 1 ? dkv_local_ : dkv_[0];
  if (n > 1) hdp_.recv(packed(dkv_local_, mine), previous, kGradientTag);
  for (CommRequest& r : gradient_sends) r.wait();
  add_inplace(dk.rows(ring_begin, T), keys(own, mine));
  add_inplace(dv.rows(ring_begin, T), values(own, mine));
}

}  // namespace hdp
