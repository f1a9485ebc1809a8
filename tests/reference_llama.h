#pragma once
// An independent, deliberately naive LLaMA forward pass in double precision,
// written straight from the Hugging Face definitions (no tiling, no kernels), with
// Mistral's sliding window when the config has one (MistralForCausalLM: a query at
// position i sees the keys at positions j with i - W < j <= i).
// Tests differentiate it numerically to check the model's hand-written backward.

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "model/model.h"

namespace hdp::testing {

using Weights = std::map<std::string, std::vector<double>>;

inline Weights weights_of(const LlamaModel& model) {
  Weights w;
  for (const ParameterInfo& p : model.parameters()) {
    const float* src = model.flat_parameters().data + p.offset;
    w[p.name] = std::vector<double>(src, src + p.numel);
  }
  return w;
}

struct ReferenceBatch {
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
};

// Sum over predicted tokens of -log softmax(logits)[target]; for Mixtral plus
// router_aux_loss_coef x aux x P (P the predicted tokens), with aux Hugging Face's load_balancing_loss_func over
// all layers' routing (E sum_e f_e P_e over the layers x T routed tokens), as
// LlamaModel::forward returns it. moe_margin: the smallest gap between a token's k-th
// and (k+1)-th router probability (finite differences need it not to flip).
inline double reference_loss(const ModelConfig& c, const Weights& W, const ReferenceBatch& b,
                             double* moe_margin_out = nullptr) {
  double moe_margin = 1e300;
  std::vector<double> moe_probability(c.num_experts, 0.0), moe_choices(c.num_experts, 0.0);
  const int64_t T = static_cast<int64_t>(b.tokens.size()), H = c.hidden_size, F = c.ffn_hidden_size;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, d = c.head_dim(), V = c.vocab_size;
  using Mat = std::vector<std::vector<double>>;
  auto matvec = [](const std::vector<double>& w, int64_t out, int64_t in, const std::vector<double>& x) {
    std::vector<double> y(out, 0.0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) y[o] += w[o * in + i] * x[i];
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const std::vector<double>& w) {
    double ms = 0;
    for (double v : x) ms += v * v;
    const double r = 1.0 / std::sqrt(ms / static_cast<double>(x.size()) + c.norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * r;
    return y;
  };
  auto rope = [&](std::vector<double>& head, int32_t pos) {
    std::vector<double> out(d);
    for (int64_t j = 0; j < d / 2; ++j) {
      const double angle = pos * std::pow(c.rope_theta, -2.0 * static_cast<double>(j) / static_cast<double>(d));
      out[j] = head[j] * std::cos(angle) - head[j + d / 2] * std::sin(angle);
      out[j + d / 2] = head[j + d / 2] * std::cos(angle) + head[j] * std::sin(angle);
    }
    head = out;
  };
  std::vector<int64_t> doc_of(T);
  for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s)
    for (int32_t t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; ++t) doc_of[t] = static_cast<int64_t>(s);

  const std::vector<double>& embed = W.at("model.embed_tokens.weight");
  Mat x(T, std::vector<double>(H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) x[t][i] = embed[b.tokens[t] * H + i];

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    Mat q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> h = rmsnorm(x[t], W.at(pre + "input_layernorm.weight"));
      q[t] = matvec(W.at(pre + "self_attn.q_proj.weight"), Hq * d, H, h);
      k[t] = matvec(W.at(pre + "self_attn.k_proj.weight"), Hkv * d, H, h);
      v[t] = matvec(W.at(pre + "self_attn.v_proj.weight"), Hkv * d, H, h);
      for (int64_t hh = 0; hh < Hq; ++hh) {
        std::vector<double> head(q[t].begin() + hh * d, q[t].begin() + (hh + 1) * d);
        rope(head, b.positions[t]);
        std::copy(head.begin(), head.end(), q[t].begin() + hh * d);
      }
      for (int64_t hh = 0; hh < Hkv; ++hh) {
        std::vector<double> head(k[t].begin() + hh * d, k[t].begin() + (hh + 1) * d);
        rope(head, b.positions[t]);
        std::copy(head.begin(), head.end(), k[t].begin() + hh * d);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> attn(Hq * d, 0.0);
      for (int64_t hh = 0; hh < Hq; ++hh) {
        const int64_t kvh = hh / (Hq / Hkv);
        std::vector<double> scores;
        std::vector<int64_t> keys;
        for (int64_t s = 0; s <= t; ++s) {
          if (doc_of[s] != doc_of[t]) continue;
          if (c.sliding_window && b.positions[t] - b.positions[s] >= *c.sliding_window) continue;
          double dot = 0;
          for (int64_t j = 0; j < d; ++j) dot += q[t][hh * d + j] * k[s][kvh * d + j];
          scores.push_back(dot / std::sqrt(static_cast<double>(d)));
          keys.push_back(s);
        }
        double mx = -1e300, z = 0;
        for (double s : scores) mx = std::max(mx, s);
        for (double s : scores) z += std::exp(s - mx);
        for (size_t i = 0; i < keys.size(); ++i) {
          const double p = std::exp(scores[i] - mx) / z;
          for (int64_t j = 0; j < d; ++j) attn[hh * d + j] += p * v[keys[i]][kvh * d + j];
        }
      }
      const std::vector<double> o = matvec(W.at(pre + "self_attn.o_proj.weight"), H, Hq * d, attn);
      for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
      const std::vector<double> h = rmsnorm(x[t], W.at(pre + "post_attention_layernorm.weight"));
      auto swiglu_ffn = [&](const std::string& gate, const std::string& up, const std::string& down) {
        const std::vector<double> g = matvec(W.at(gate), F, H, h);
        const std::vector<double> u = matvec(W.at(up), F, H, h);
        std::vector<double> a(F);
        for (int64_t i = 0; i < F; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
        return matvec(W.at(down), H, F, a);
      };
      if (!c.moe()) {
        const std::vector<double> down =
            swiglu_ffn(pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight", pre + "mlp.down_proj.weight");
        for (int64_t i = 0; i < H; ++i) x[t][i] += down[i];
        continue;
      }
      // Mixtral: softmax router, top-k renormalised, weighted experts (MixtralSparseMoeBlock).
      const int64_t E = c.num_experts, K = c.experts_per_token;
      const std::vector<double> logits = matvec(W.at(pre + "block_sparse_moe.gate.weight"), E, H, h);
      const double mx = *std::max_element(logits.begin(), logits.end());
      std::vector<double> p(E);
      double z = 0;
      for (int64_t e = 0; e < E; ++e) z += std::exp(logits[e] - mx);
      for (int64_t e = 0; e < E; ++e) p[e] = std::exp(logits[e] - mx) / z;
      std::vector<int64_t> order(E);
      for (int64_t e = 0; e < E; ++e) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b2) { return p[a] > p[b2]; });
      if (K < E) moe_margin = std::min(moe_margin, p[order[K - 1]] - p[order[K]]);
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) sum += p[order[j]];
      for (int64_t e = 0; e < E; ++e) moe_probability[e] += p[e];
      for (int64_t j = 0; j < K; ++j) {
        const std::string ex = pre + "block_sparse_moe.experts." + std::to_string(order[j]) + ".";
        moe_choices[order[j]] += 1;
        const std::vector<double> y = swiglu_ffn(ex + "w1.weight", ex + "w3.weight", ex + "w2.weight");
        for (int64_t i = 0; i < H; ++i) x[t][i] += p[order[j]] / sum * y[i];
      }
    }
  }
  const std::vector<double>& head = c.tie_embeddings ? embed : W.at("lm_head.weight");
  double loss = 0;
  if (c.moe()) {
    const double N = static_cast<double>(c.num_layers * T);
    double aux = 0;
    for (int64_t e = 0; e < c.num_experts; ++e) aux += (moe_choices[e] / N) * (moe_probability[e] / N);
    double predicted = 0;
    for (int32_t target : b.targets) predicted += target >= 0;
    loss += c.router_aux_loss_coef * static_cast<double>(c.num_experts) * aux * predicted;
  }
  if (moe_margin_out) *moe_margin_out = moe_margin;
  for (int64_t t = 0; t < T; ++t) {
    if (b.targets[t] < 0) continue;
    const std::vector<double> logits = matvec(head, V, H, rmsnorm(x[t], W.at("model.norm.weight")));
    double mx = -1e300, z = 0;
    for (double l : logits) mx = std::max(mx, l);
    for (double l : logits) z += std::exp(l - mx);
    loss += mx + std::log(z) - logits[b.targets[t]];
  }
  return loss;
}

}  // namespace hdp::testing
