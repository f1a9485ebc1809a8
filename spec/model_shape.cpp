#include "spec/model_shape.h"

#include <optional>
#include <stdexcept>

#include "spec/model_checks.h"

namespace hdp {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The router: one logit per expert, replicated on every tp rank; none in a dense model.
double router_parameters(const ModelShape& m) {
  return m.experts > 1 ? static_cast<double>(m.hidden) * static_cast<double>(m.experts) : 0.0;
}

}  // namespace

double attention_pairs(int64_t seq_len, int64_t window) {
  const double s = static_cast<double>(seq_len), w = static_cast<double>(window);
  if (window <= 0 || seq_len <= window) return s * (s + 1) / 2;
  return w * (w + 1) / 2 + (s - w) * w;
}

void validate_model_shape(const ModelShape& m) {
  auto positive = [](int64_t v, const char* field) {
    if (v < 1) throw std::invalid_argument(std::string(field) + " must be at least 1, got " + str(v));
  };
  positive(m.layers, "num_layers");
  positive(m.hidden, "hidden_size");
  positive(m.heads, "num_heads");
  positive(m.kv_heads, "num_kv_heads");
  positive(m.head_dim, "head_dim");
  positive(m.ffn, "ffn_hidden_size");
  positive(m.vocab, "vocab_size");
  positive(m.experts, "num_experts");
  positive(m.experts_per_token, "experts_per_token");
  if (m.window < 0) throw std::invalid_argument("sliding_window must be positive (or 0 for none), got " + str(m.window));
  if (m.experts_per_token > m.experts)
    throw std::invalid_argument("experts_per_token " + str(m.experts_per_token) + " exceeds num_experts " +
                                str(m.experts));
}

void validate_split(const ModelShape& m, int tp, int pp, int vpp) {
  if (const std::optional<ModelIssue> issue = layout_issue(m, ParallelDegrees{tp, pp, 1, 1, vpp}))
    throw std::invalid_argument(describe_issue(*issue));
}

LayerSlice layer_slice(const ModelShape& m, int tp) {
  LayerSlice s;
  s.heads = m.heads / tp;
  s.q_dim = s.heads * m.head_dim;
  s.kv_dim = m.kv_heads / tp * m.head_dim;
  s.ffn = m.ffn / tp;
  return s;
}

double expert_parameters(const ModelShape& m) {
  return 3 * static_cast<double>(m.hidden) * static_cast<double>(m.ffn) * static_cast<double>(m.experts);
}

double layer_parameters(const ModelShape& m) {
  const double H = static_cast<double>(m.hidden);
  const double qdim = static_cast<double>(m.heads * m.head_dim), kvdim = static_cast<double>(m.kv_heads * m.head_dim);
  // Projections, every expert's gate, up and down, the router, and the two norms.
  return H * (qdim + 2 * kvdim) + qdim * H + expert_parameters(m) + router_parameters(m) + 2 * H;
}

double embedding_parameters(const ModelShape& m) {
  return static_cast<double>(m.vocab) * static_cast<double>(m.hidden);
}

double head_parameters(const ModelShape& m, int pp) {
  return (m.tied_embeddings && pp == 1 ? 0.0 : embedding_parameters(m)) + static_cast<double>(m.hidden);
}

double layer_matmul_flops_per_token(const ModelShape& m, int tp) {
  const LayerSlice s = layer_slice(m, tp);
  const double H = static_cast<double>(m.hidden), q = static_cast<double>(s.q_dim);
  const double kv = static_cast<double>(s.kv_dim);
  const double ffn = static_cast<double>(s.ffn) * static_cast<double>(m.experts_per_token);
  return 6 * (H * (q + 2 * kv) + q * H + 3 * H * ffn + router_parameters(m));
}

double attention_flops_per_token_pair(const ModelShape& m, int tp) {
  return 12 * static_cast<double>(layer_slice(m, tp).q_dim);
}

double layer_flops_per_token(const ModelShape& m, int tp, int64_t seq_len) {
  const double pair = attention_flops_per_token_pair(m, tp), s = static_cast<double>(seq_len);
  // Within the window every query sees all earlier keys: (s + 1) / 2 on average.
  if (m.window <= 0 || seq_len <= m.window) return layer_matmul_flops_per_token(m, tp) + pair / 2 * (s + 1.0);
  return layer_matmul_flops_per_token(m, tp) + pair * attention_pairs(seq_len, m.window) / s;
}

double head_flops_per_token(const ModelShape& m, int tp) {
  return 6 * static_cast<double>(m.vocab) * static_cast<double>(m.hidden) / tp;
}

double training_flops(const ModelShape& m, std::span<const int64_t> sequence_lengths) {
  double flops = 0;
  for (int64_t s : sequence_lengths) {
    flops += static_cast<double>(s) *
             (static_cast<double>(m.layers) * layer_flops_per_token(m, 1, s) + head_flops_per_token(m, 1));
  }
  return flops;
}

ActivationWidths activation_widths(const ModelShape& m, int tp, RecomputeMode mode, bool ring) {
  const LayerSlice s = layer_slice(m, tp);
  const int64_t experts = 2 * s.ffn * m.experts_per_token, router = m.experts > 1 ? m.experts : 0;
  switch (mode) {
    case RecomputeMode::None:  // x_in, ln1, x_mid, ln2 | rstd1, rstd2 are the sequence part
      return {4 * m.hidden + 2 * s.q_dim + 2 * s.kv_dim + experts, 2 + s.heads + router, 4 * m.hidden, 2};
    case RecomputeMode::Selective:  // x_in, x_mid; q, attention output; k, v; gate, up | log-sum-exp
      return {2 * m.hidden + 2 * s.q_dim + 2 * s.kv_dim + experts, s.heads + router, 2 * m.hidden, 0};
    case RecomputeMode::Full:  // x_in (a ring layer: and the attention output | its log-sum-exp)
      break;
  }
  const int64_t moe_kept = m.experts > 1 ? experts : 0;
  return {m.hidden + (ring ? s.q_dim : 0) + moe_kept, (ring ? s.heads : 0) + router, m.hidden, 0};
}

double ActivationWidths::bytes_per_token(int bytes_per_value, int sequence_shards) const {
  const double shards = static_cast<double>(sequence_shards);
  const double rows = static_cast<double>(row - sequence_row) + static_cast<double>(sequence_row) / shards;
  const double smalls = static_cast<double>(small - sequence_small) + static_cast<double>(sequence_small) / shards;
  return static_cast<double>(bytes_per_value) * rows + 4.0 * smalls;
}

double saved_bytes_per_token(const ModelShape& m, int tp, int bytes_per_value, RecomputeMode mode, bool ring,
                             bool sequence_parallel) {
  return activation_widths(m, tp, mode, ring).bytes_per_token(bytes_per_value, sequence_parallel ? tp : 1);
}

RecomputeFlops recompute_flops(const ModelShape& m, int tp, RecomputeMode mode, bool ring) {
  if (mode != RecomputeMode::Full) return {};
  const LayerSlice s = layer_slice(m, tp);
  const double H = static_cast<double>(m.hidden), q = static_cast<double>(s.q_dim);
  const double kv = static_cast<double>(s.kv_dim), ffn = static_cast<double>(s.ffn);
  const double projections = 2 * (H * (q + 2 * kv) + q * H);
  const double gate_up = m.experts > 1 ? 0.0 : 2 * 2 * H * ffn;
  return {projections + gate_up, ring ? 0.0 : 4 * q};
}

double kv_bytes_per_token(const ModelShape& m, int tp, int bytes_per_value) {
  return 2 * static_cast<double>(layer_slice(m, tp).kv_dim) * bytes_per_value;
}

double boundary_bytes_per_token(const ModelShape& m, int bytes_per_value) {
  return static_cast<double>(m.hidden) * bytes_per_value;
}

}  // namespace hdp
