#include "parallel/ring_attention.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "parallel/op_tracer.h"
#include "parallel/progress.h"

namespace hdp {
namespace {

constexpr int kKeyValueTag = 1001;
constexpr int kGradientTag = 1002;
constexpr int kMemberSumTag = 1003;
static_assert(kMemberSumTag <= kGuaranteedMaxTag, "ring attention's tags are constants every MPI allows");

}  // namespace

RingAttention::RingAttention(Communicator& hdp, int64_t max_tokens, int64_t q_heads, int64_t kv_heads,
                             int64_t head_dim, int64_t window, DType precision, Device device)
    : hdp_(hdp),
      max_tokens_(max_tokens),
      q_heads_(q_heads),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      window_(window),
      precision_(precision),
      arena_(Arena::counting(device, "ring attention")) {
  if (precision != DType::F32 && precision != DType::BF16) {
    throw std::invalid_argument(std::string("ring attention: activations in ") + dtype_name(precision) +
                                ", not fp32 or bf16");
  }
  const int64_t block = 2 * max_tokens * kv_heads * head_dim;
  const int64_t q_elements = max_tokens * q_heads * head_dim, kv_elements = max_tokens * kv_heads * head_dim;
  auto layout = [&](Arena& a) {
    for (Tensor& t : kv_) t = a.tensor({block}, precision);
    send_ = a.tensor({block}, precision);
    dkv_ = a.tensor({block});
    dkv_back_ = a.tensor({block});
    if (precision == DType::BF16) {
      kv_f32_ = a.tensor({block});
      for (Tensor* t : {&q_f32_, &out_f32_, &dout_f32_, &dq_f32_}) *t = a.tensor({q_elements});
      for (Tensor* t : {&k_f32_, &v_f32_, &dk_f32_, &dv_f32_}) *t = a.tensor({kv_elements});
    }
  };
  Arena sizing = Arena::counting(device, "ring attention");
  layout(sizing);
  arena_ = Arena(device, sizing.used(), "ring attention");
  layout(arena_);
}

Tensor RingAttention::packed(const Tensor& buffer, int64_t rows) const {
  return buffer.rows(0, 2 * rows * kv_heads_ * head_dim_);
}

Tensor RingAttention::keys(const Tensor& buffer, int64_t rows) const {
  const int64_t n = rows * kv_heads_ * head_dim_;
  return buffer.rows(0, n).view({rows, kv_heads_, head_dim_});
}

Tensor RingAttention::values(const Tensor& buffer, int64_t rows) const {
  const int64_t n = rows * kv_heads_ * head_dim_;
  return buffer.rows(n, 2 * n).view({rows, kv_heads_, head_dim_});
}

Tensor RingAttention::received_fp32(const Tensor& buffer, int64_t rows) {
  if (buffer.dtype == DType::F32) return buffer;
  copy(packed(kv_f32_, rows), packed(buffer, rows));  // exact
  return kv_f32_;
}

Tensor RingAttention::image_of(const Tensor& image, const Tensor& t, bool widen) {
  Tensor f = t;
  f.data = image.data;
  f.dtype = DType::F32;
  if (widen) copy(f, t);
  return f;
}

void RingAttention::check_call(const char* what, int64_t T, int64_t ring_begin, const RingLayout& ring,
                               std::initializer_list<const Tensor*> activations) const {
  const int64_t mine = ring.rows(ring.self);
  if (T - ring_begin != mine || T > max_tokens_) {
    throw std::invalid_argument(std::string("ring attention ") + what + ": " + std::to_string(T - ring_begin) +
                                " ring rows, the layout says " + std::to_string(mine) + " (" + std::to_string(T) +
                                " rows; buffers hold " + std::to_string(max_tokens_) + ")");
  }
  for (const Tensor* t : activations) {
    if (t->dtype != precision_) {
      throw std::invalid_argument(std::string("ring attention ") + what + ": a " + dtype_name(t->dtype) +
                                  " tensor, the ring was built for " + dtype_name(precision_) + " activations");
    }
  }
}

void RingAttention::ring_blocks(const RingLayout& ring, int source, std::span<const ChunkRows> held,
                                int64_t ring_begin, int64_t k_offset) {
  blocks_.clear();
  int64_t q_row = ring_begin;
  for (const RingChunk& mine : ring.chunks[ring.self]) {
    int64_t k_row = k_offset;
    for (size_t c = 0; c < ring.chunks[source].size(); ++c) {
      const RingChunk& theirs = ring.chunks[source][c];
      const ChunkRows run = held[c];
      const int64_t first = theirs.position + run.begin, last = theirs.position + run.end - 1;
      // Skipped: keys all in this chunk's future, or all at least W before its first query.
      const bool visible = theirs.sequence == mine.sequence && run.rows() > 0 &&
                           first <= mine.position + mine.rows - 1 &&
                           (window_ <= 0 || last > mine.position - window_);
      if (visible) {
        blocks_.push_back({static_cast<int32_t>(q_row), static_cast<int32_t>(q_row + mine.rows),
                           static_cast<int32_t>(k_row), static_cast<int32_t>(k_row + run.rows()),
                           static_cast<int32_t>(mine.position), static_cast<int32_t>(first)});
      }
      k_row += run.rows();
    }
    q_row += mine.rows;
  }
}

CommRequest RingAttention::post_exchange(const RingLayout& ring, int t, const Tensor& k, const Tensor& v,
                                         int64_t ring_begin, const Tensor& into) {
  const int n = static_cast<int>(ring.peers.size()), p = ring.self;
  const int from = (p - t + n) % n, to = (p + t) % n;
  // At most one message each way: fixed slots, nothing allocated per step.
  Transfer send[1], receive[1];
  size_t sends = 0, receives = 0;
  key_rows_needed(ring, from, p, window_, incoming_);
  const int64_t incoming = total_rows(incoming_);
  if (incoming > 0) receive[receives++] = {packed(into, incoming), ring.peers[from], kKeyValueTag};
  key_rows_needed(ring, p, to, window_, sent_);
  const int64_t outgoing = total_rows(sent_);
  int64_t row = 0, chunk_row = ring_begin;
  for (size_t c = 0; c < sent_.size() && outgoing > 0; ++c) {
    const ChunkRows run = sent_[c];
    if (run.rows() > 0) {
      copy(keys(send_, outgoing).rows(row, row + run.rows()), k.rows(chunk_row + run.begin, chunk_row + run.end));
      copy(values(send_, outgoing).rows(row, row + run.rows()), v.rows(chunk_row + run.begin, chunk_row + run.end));
      row += run.rows();
    }
    chunk_row += ring.chunks[p][c].rows;
  }
  if (outgoing > 0) send[sends++] = {packed(send_, outgoing), ring.peers[to], kKeyValueTag};
  if (sends == 0 && receives == 0) return {};
  return hdp_.exchange(std::span<const Transfer>(send, sends), std::span<const Transfer>(receive, receives));
}

void RingAttention::forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            std::span<const AttentionBlock> local_blocks, const RingLayout& ring,
                            int64_t ring_begin) {
  progress::Context context("ring attention forward");
  check_call("forward", q.dim(0), ring_begin, ring, {&out, &q, &k, &v});
  if (precision_ == DType::F32) return forward_fp32(out, lse, q, k, v, k, v, local_blocks, ring, ring_begin);
  const Tensor out32 = image_of(out_f32_, out, false);
  forward_fp32(out32, lse, image_of(q_f32_, q, true), image_of(k_f32_, k, true), image_of(v_f32_, v, true), k, v,
               local_blocks, ring, ring_begin);
  copy(out, out32);  // the output's one rounding
}

void RingAttention::forward_fp32(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& wire_k, const Tensor& wire_v,
                                 std::span<const AttentionBlock> local_blocks, const RingLayout& ring,
                                 int64_t ring_begin) {
  const int n = static_cast<int>(ring.peers.size()), p = ring.self;
  const int64_t T = q.dim(0);
  attention_reset_rows(out, lse, 0, T);
  if (!local_blocks.empty()) attention_forward_blocks(out, lse, q, k, v, local_blocks, window_);

  own_.assign(ring.chunks[p].size(), ChunkRows{});
  for (size_t c = 0; c < own_.size(); ++c) own_[c] = {0, ring.chunks[p][c].rows};
  int current = 0;
  for (int step = 0; step < n; ++step) {
    // At step t this member computes against member p - t's rows (its own at step 0,
    // read in place) while the rows of step t + 1 arrive.
    const int source = (p - step + n) % n;
    CommRequest exchange;
    if (step + 1 < n) exchange = post_exchange(ring, step + 1, wire_k, wire_v, ring_begin, kv_[1 - current]);
    if (step == 0) {
      ring_blocks(ring, p, own_, ring_begin, ring_begin);
      if (!blocks_.empty()) attention_forward_blocks(out, lse, q, k, v, blocks_, window_);
    } else {
      key_rows_needed(ring, source, p, window_, held_);
      const int64_t rows = total_rows(held_);
      ring_blocks(ring, source, held_, ring_begin, 0);
      if (!blocks_.empty()) {
        const Tensor held = received_fp32(kv_[current], rows);
        attention_forward_blocks(out, lse, q, keys(held, rows), values(held, rows), blocks_, window_);
      }
    }
    {
      TraceSpan span(trace_ops::kRingExchange.data());  // the exposed wait, nested in a compute op
      exchange.wait();
    }
    current = 1 - current;
  }
}

void RingAttention::backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             std::span<const AttentionBlock> local_blocks, const RingLayout& ring,
                             int64_t ring_begin) {
  progress::Context context("ring attention backward");
  check_call("backward", q.dim(0), ring_begin, ring, {&dq, &dk, &dv, &dout, &q, &k, &v, &out});
  if (precision_ == DType::F32) {
    return backward_fp32(dq, dk, dv, dout, q, k, v, k, v, out, lse, local_blocks, ring, ring_begin);
  }
  const Tensor dq32 = image_of(dq_f32_, dq, false), dk32 = image_of(dk_f32_, dk, false),
               dv32 = image_of(dv_f32_, dv, false);
  backward_fp32(dq32, dk32, dv32, image_of(dout_f32_, dout, true), image_of(q_f32_, q, true),
                image_of(k_f32_, k, true), image_of(v_f32_, v, true), k, v, image_of(out_f32_, out, true), lse,
                local_blocks, ring, ring_begin);
  // The gradients' one rounding, after every step's contribution was added in fp32.
  copy(dq, dq32);
  copy(dk, dk32);
  copy(dv, dv32);
}

void RingAttention::backward_fp32(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const Tensor& wire_k, const Tensor& wire_v,
                                  const Tensor& out, const Tensor& lse, std::span<const AttentionBlock> local_blocks,
                                  const RingLayout& ring, int64_t ring_begin) {
  const int n = static_cast<int>(ring.peers.size()), p = ring.self;
  fill(dq, 0.0f);
  fill(dk, 0.0f);
  fill(dv, 0.0f);
  if (!local_blocks.empty()) attention_backward_blocks(dq, dk, dv, dout, q, k, v, out, lse, local_blocks, window_);

  own_.assign(ring.chunks[p].size(), ChunkRows{});
  for (size_t c = 0; c < own_.size(); ++c) own_[c] = {0, ring.chunks[p][c].rows};
  int current = 0;
  for (int step = 0; step < n; ++step) {
    const int source = (p - step + n) % n, reader = (p + step) % n;
    CommRequest exchange, gradients;
    if (step + 1 < n) exchange = post_exchange(ring, step + 1, wire_k, wire_v, ring_begin, kv_[1 - current]);
    Transfer gradient_send[1], gradient_receive[1];  // at most one each way, as in post_exchange
    size_t gradient_sends = 0, gradient_receives = 0;
    if (step == 0) {
      ring_blocks(ring, p, own_, ring_begin, ring_begin);
      if (!blocks_.empty()) attention_backward_blocks(dq, dk, dv, dout, q, k, v, out, lse, blocks_, window_);
    } else {
      key_rows_needed(ring, source, p, window_, held_);
      const int64_t rows = total_rows(held_);
      if (rows > 0) {
        fill(packed(dkv_, rows), 0.0f);
        ring_blocks(ring, source, held_, ring_begin, 0);
        const Tensor held = received_fp32(kv_[current], rows);
        attention_backward_blocks(dq, keys(dkv_, rows), values(dkv_, rows), dout, q, keys(held, rows),
                                  values(held, rows), out, lse, blocks_, window_);
        gradient_send[gradient_sends++] = {packed(dkv_, rows), ring.peers[source], kGradientTag};
      }
    }
    // This step's key/value gradients go back to their owner p - t while the gradient
    // of this member's rows that member p + t read comes back: one grouped exchange,
    // posted once this member's part is computed (the reader's part arrives when the
    // reader has computed it, so posting the receive earlier would gain nothing).
    int64_t back_rows = 0;
    if (step > 0) {
      key_rows_needed(ring, p, reader, window_, back_);
      back_rows = total_rows(back_);
      if (back_rows > 0) gradient_receive[gradient_receives++] = {packed(dkv_back_, back_rows), ring.peers[reader], kGradientTag};
    }
    if (gradient_sends > 0 || gradient_receives > 0) {
      gradients = hdp_.exchange(std::span<const Transfer>(gradient_send, gradient_sends),
                                std::span<const Transfer>(gradient_receive, gradient_receives));
    }
    if (back_rows > 0) {
      {
        TraceSpan span(trace_ops::kRingExchange.data());
        gradients.wait();
      }
      int64_t row = 0, chunk_row = ring_begin;
      for (size_t c = 0; c < back_.size(); ++c) {
        const ChunkRows run = back_[c];
        if (run.rows() > 0) {
          add_inplace(dk.rows(chunk_row + run.begin, chunk_row + run.end),
                      keys(dkv_back_, back_rows).rows(row, row + run.rows()));
          add_inplace(dv.rows(chunk_row + run.begin, chunk_row + run.end),
                      values(dkv_back_, back_rows).rows(row, row + run.rows()));
          row += run.rows();
        }
        chunk_row += ring.chunks[p][c].rows;
      }
    }
    {
      TraceSpan span(trace_ops::kRingExchange.data());  // the exposed wait, nested in a compute op
      gradients.wait();
      exchange.wait();
    }
    current = 1 - current;
  }
}

void RingAttention::sum_over_members(std::span<float> values, const RingLayout& ring) {
  progress::Context context("ring statistics exchange");
  const int n = static_cast<int>(ring.peers.size()), p = ring.self;
  const int64_t m = static_cast<int64_t>(values.size());
  members_values_.resize(static_cast<size_t>(n * m));
  std::copy(values.begin(), values.end(), members_values_.begin() + p * m);
  member_sends_.clear();
  member_receives_.clear();
  for (int j = 0; j < n; ++j) {
    if (j == p) continue;
    member_sends_.push_back({Tensor(values.data(), {m}), ring.peers[j], kMemberSumTag});
    member_receives_.push_back({Tensor(members_values_.data() + j * m, {m}), ring.peers[j], kMemberSumTag});
  }
  hdp_.exchange(member_sends_, member_receives_).wait();
  for (int64_t i = 0; i < m; ++i) {
    float sum = 0;
    for (int j = 0; j < n; ++j) sum += members_values_[j * m + i];
    values[i] = sum;
  }
}

}  // namespace hdp
