#pragma once
// The shape of a LLaMA-family model (no weights) and the counts that follow from
// it: parameters, forward + backward FLOPs per token and the values a layer keeps
// for backward, whole or for one rank of a tensor-parallel group. The one
// definition behind the trainer's MFU and pipeline split, the planners' FLOP-derived
// cost model and `trainer plan`'s simulator.
//
// Tensor parallelism as in Megatron-LM (Shoeybi et al., 2019): tp shards the
// query heads, the KV heads (tp divides them, spec/model_checks.h: no KV head is
// replicated), every expert's FFN and the LM head's vocabulary; the
// norms and the MoE router are replicated. Tensors of size hidden per token (the
// residual stream and the norms) are held whole on every rank, or, under sequence
// parallelism (Korthikanti et al. 2022), for 1/tp of the tokens (activation_widths).
//
// FLOPs: a matmul of an [s, k] by a [k, n] matrix costs 2 s k n forward and twice
// that backward (the gradients of both operands), so every matmul parameter costs
// 6 FLOPs per token. Attention's QK^T and PV cost 2 qdim each per (query, visible
// key) pair forward, so 12 qdim forward + backward.
//
// Visible pairs: a causal document of s tokens has s (s + 1) / 2 (query, key) pairs;
// with Mistral's sliding window W (Jiang et al. 2023, "Mistral 7B": a query sees
// the W most recent keys, itself included) a document longer than W has
// W (W + 1) / 2 + (s - W) W, so attention grows linearly in s past the window.

#include <cstdint>
#include <span>
#include <string>

#include "base/enum_names.h"

namespace hdp {

// The arithmetic view of a model, which ModelConfig::shape() (spec/model_config.h)
// derives from a described model: the training config, a `trainer plan` model
// file and an imported Hugging Face config are all read as a ModelConfig first. It
// stays a struct of its own because the counts below need sizes only, with the
// architecture resolved (a dense model has 1 expert whatever num_experts says, no
// window is 0), and the cost model's tests and benchmarks state hypothetical
// shapes directly. MoE: every layer has `experts` FFNs of size ffn and each token
// runs `experts_per_token` of them; dense models have 1 and 1.
struct ModelShape {
  std::string name;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t experts = 1, experts_per_token = 1;
  bool tied_embeddings = false;
  int64_t window = 0;  // sliding window W of every layer's attention; 0: none (full causal)
};

// (query, visible key) pairs of one causal document of s tokens under a sliding
// window (0: none): s (s + 1) / 2, or W (W + 1) / 2 + (s - W) W when s > W.
double attention_pairs(int64_t seq_len, int64_t window);

// Throws std::invalid_argument naming the first field the counts cannot take
// (sizes below 1, more active experts than experts): what the arithmetic needs of
// a shape stated directly. A described model is checked whole by model_issue
// (spec/model_checks.h) before its shape is derived.
void validate_model_shape(const ModelShape& model);
// Throws std::invalid_argument (describe_issue of layout_issue, spec/model_checks.h)
// unless the model splits over tp tensor-parallel ranks and pp pipeline stages (of
// vpp model chunks each).
void validate_split(const ModelShape& model, int tp, int pp, int vpp = 1);

// The one rule for grouped-query attention under tensor parallelism: every rank
// of a tp group holds num_kv_heads / tp whole KV heads (Megatron-LM's split), and
// no rank holds a replica of another's, so tp must divide num_kv_heads; with
// fewer KV heads than ranks the layout is refused (layout_issue,
// spec/model_checks.h, for the config, the planner and the model alike).
inline bool tp_divides_kv_heads(int64_t kv_heads, int64_t tp) { return tp >= 1 && kv_heads % tp == 0; }

// What one rank of a tensor-parallel group of tp holds of a layer (a split
// validate_split accepts).
struct LayerSlice {
  int64_t heads = 0;   // query heads
  int64_t q_dim = 0;   // heads x head_dim
  int64_t kv_dim = 0;  // KV heads x head_dim
  int64_t ffn = 0;     // of one expert
};
LayerSlice layer_slice(const ModelShape& model, int tp);

// Parameters of the whole model (not per rank): one layer with all its experts,
// the embedding (vocab x hidden), and the LM head with the final norm (the head
// shares the embedding's weights when tied, unless pp > 1 puts them on different
// stages).
double layer_parameters(const ModelShape& model);
// The part of layer_parameters in its experts' FFNs (gate, up and down of all
// `experts`): what expert parallelism shards, 3 hidden ffn experts (the router is not
// an expert's). A dense model's one FFN counts too (experts = 1).
double expert_parameters(const ModelShape& model);
double embedding_parameters(const ModelShape& model);
double head_parameters(const ModelShape& model, int pp);

// Forward + backward FLOPs on one rank of tp: one layer's projections, active
// experts and router per token; its attention per (query, visible key) pair; one
// layer per token of a causal sequence of seq_len tokens (a token sees
// attention_pairs(seq_len, window) / seq_len keys on average: (seq_len + 1) / 2
// without a window); the LM head per token.
double layer_matmul_flops_per_token(const ModelShape& model, int tp);
double attention_flops_per_token_pair(const ModelShape& model, int tp);
double layer_flops_per_token(const ModelShape& model, int tp, int64_t seq_len);
double head_flops_per_token(const ModelShape& model, int tp);
// The whole model (all stages and ranks) for causal sequences of these lengths.
double training_flops(const ModelShape& model, std::span<const int64_t> sequence_lengths);

// Activation recomputation (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models"): what a layer keeps of its forward
// for backward; the rest is rerun at the start of its backward.
//   none: everything activation_widths lists.
//   selective: the GEMM outputs (q and k after RoPE, which is applied in place, so
//     keeping them rotated costs nothing more; v; the attention output; the
//     attention residual x_mid = x_in + o(...); gate and up) and attention's
//     log-sum-exp; the two RMSNorms (outputs and 1/rms) are rerun. SwiGLU's
//     product is rerun in backward in every mode.
//   full: the layer input only. A layer whose micro-batch takes part in a ring
//     also keeps its attention output and log-sum-exp (what ring attention's
//     backward needs) instead of redoing the ring: redoing it costs the quadratic
//     attention FLOPs and p - 1 K/V hops again, keeping it q_dim + heads values
//     per token (1/8 of the input's for LLaMA-70B at tp 8), and the rest reruns
//     from GEMMs that are linear in the tokens.
// A Mixtral layer's experts keep their routed rows in every mode (model/moe.h: its
// routing and all-to-alls belong to forward and are not rerun), so the active
// experts' gate and up and the router logits stay in every mode.
enum class RecomputeMode { None, Selective, Full };
inline constexpr EnumName<RecomputeMode> kRecomputeModeNames[] = {
    {RecomputeMode::None, "none", "every layer keeps all it saves for backward"},
    {RecomputeMode::Selective, "selective", "keep the GEMM outputs and attention's log-sum-exp, rerun the norms"},
    {RecomputeMode::Full, "full", "keep the layer input (and a ring layer's attention output), rerun the layer"}};

// Values one layer of one rank of tp saves per token for backward: `row` values
// of the activation type, which offload can move to host memory, and `small` fp32
// values. Without recomputation: the layer input, both norm outputs, the attention
// residual, q and the attention output, k and v after RoPE, gate and up of each
// active expert (rows); two 1/rms, the heads' log-sum-exp, the router logits of an
// MoE layer (small). With recomputation the part RecomputeMode keeps; ring: the
// layer's micro-batch takes part in a ring (matters for full only).
// Of those, sequence_row and sequence_small are the norms' and the residual
// stream's: the layer input, the two norm outputs and the attention residual x_mid
// (rows), the two 1/rms (small), as far as the mode keeps them. Sequence
// parallelism (Korthikanti et al. 2022, section 4.2.2) holds these for 1/tp of the
// tokens: a rank keeps its shard of the sequence and all-gathers the norm outputs
// again in backward, as Megatron does; everything else is whole.
struct ActivationWidths {
  int64_t row = 0;
  int64_t small = 0;
  int64_t sequence_row = 0, sequence_small = 0;
  // Bytes per token: row values of bytes_per_value bytes, small ones of 4, the
  // sequence part divided over sequence_shards ranks (tp under sequence
  // parallelism, else 1).
  double bytes_per_token(int bytes_per_value, int sequence_shards = 1) const;
};
ActivationWidths activation_widths(const ModelShape& model, int tp, RecomputeMode mode = RecomputeMode::None,
                                   bool ring = false);

// Bytes per token on one rank of tp with activations of bytes_per_value bytes
// (4: fp32 as this trainer runs; 2: bf16 as the planning what-ifs assume): what
// one layer saves for backward (under `mode`, and with sequence parallelism over
// the tp ranks, see activation_widths), the K and V
// one layer sends around a ring-attention ring, and the activation (or its
// gradient) sent between pipeline stages.
double saved_bytes_per_token(const ModelShape& model, int tp, int bytes_per_value,
                             RecomputeMode mode = RecomputeMode::None, bool ring = false,
                             bool sequence_parallel = false);

// Forward FLOPs a recomputed layer reruns at the start of its backward on one rank
// of tp (what DecoderBlocks' *_recompute reruns, model/decoder_blocks.h): per token
// (matmuls) and per (query, visible key) pair (attention), at 2 FLOPs per
// multiply-add as the forward counts above. full: the q, k, v and o projections, a
// dense layer's gate and up (backward never needs down's output), and attention
// unless the layer's micro-batch is in a ring (it keeps the output and log-sum-exp);
// a Mixtral layer's router and experts keep their outputs and are not rerun.
// selective reruns the two RMSNorms, which these counts leave out as they leave out
// every norm: 0, as none. SwiGLU's product is rerun in every mode and not counted.
struct RecomputeFlops {
  double per_token = 0, per_pair = 0;
};
RecomputeFlops recompute_flops(const ModelShape& model, int tp, RecomputeMode mode, bool ring = false);
double kv_bytes_per_token(const ModelShape& model, int tp, int bytes_per_value);
double boundary_bytes_per_token(const ModelShape& model, int bytes_per_value);

}  // namespace hdp
