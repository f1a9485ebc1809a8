#include "spec/model_checks.h"

#include <limits>

#include "base/yaml_reader.h"

namespace hdp {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The checks of one model in one wording, each returning whether it holds; the
// first that fails leaves its issue behind.
class Rules {
 public:
  explicit Rules(const KeyWording& wording) : wording_(wording) {}

  std::string name(const std::string& key) const { return wording_.name_of(key); }
  std::string shown(const std::string& key, int64_t value) const { return wording_.shown(key, str(value)); }
  std::string shown(const std::string& key, double value) const { return wording_.shown(key, format_double(value)); }
  std::string shown(const std::string& key, const std::string& text) const {
    return wording_.shown(key, "'" + text + "'");
  }
  // "<name> <value>": another key named inside a problem.
  std::string named(const std::string& key, int64_t value) const { return name(key) + " " + shown(key, value); }

  bool require(bool ok, const std::string& key, const std::string& problem, const std::string& valid,
               std::vector<std::string> related = {}) {
    if (!ok && !issue) issue = ModelIssue{key, problem, valid, std::move(related)};
    return ok;
  }
  bool positive(int64_t v, const std::string& key) {
    return require(v > 0, key, shown(key, v) + " is not positive", "it must be at least 1");
  }
  bool positive(double v, const std::string& key) {
    return require(v > 0, key, shown(key, v) + " is not positive", "it must be greater than 0");
  }
  bool at_most(int64_t v, int64_t limit, const std::string& key) {
    return require(v <= limit, key, shown(key, v) + " is above " + str(limit),
                   "this build supports at most " + str(limit) + "; check the value for a typo");
  }
  // "<divisor> does not divide <name> <value>", at the divisor's key.
  bool divides(int64_t divisor, const std::string& divisor_key, int64_t value, const std::string& value_key,
               const std::string& valid) {
    return require(value % divisor == 0, divisor_key,
                   shown(divisor_key, divisor) + " does not divide " + named(value_key, value), valid, {value_key});
  }

  std::optional<ModelIssue> issue;

 private:
  const KeyWording& wording_;
};

}  // namespace

std::string describe_issue(const ModelIssue& issue, const KeyWording& wording) {
  return wording.name_of(issue.key) + ": " + issue.problem + (issue.valid.empty() ? "" : "; " + issue.valid);
}

std::optional<ModelIssue> model_issue(const ModelConfig& m, const KeyWording& wording) {
  Rules r(wording);
  const bool known_arch = r.require(m.arch == "llama" || m.arch == "mistral" || m.arch == "mixtral", "model.arch",
                                    "unsupported architecture " + r.shown("model.arch", m.arch),
                                    "choose 'llama', 'mistral' or 'mixtral'");
  if (!known_arch) return r.issue;
  // As Hugging Face configs: MistralConfig and MixtralConfig carry sliding_window (4096
  // in Mistral 7B v0.1, null from v0.2 on), LlamaConfig has none, so a window on llama
  // is a mistake.
  if (m.sliding_window) {
    const int64_t w = *m.sliding_window;
    if (!r.require(m.arch != "llama", "model.sliding_window",
                   "a sliding window needs " + r.name("model.arch") + " 'mistral' or 'mixtral', not " +
                       r.shown("model.arch", m.arch),
                   "set model.arch: mistral, or remove model.sliding_window (or set it to null) for full attention",
                   {"model.arch"}) ||
        !r.require(w >= 1, "model.sliding_window", r.shown("model.sliding_window", w) + " is not positive",
                   "it must be at least 1 (keys a query sees, itself included), or null for full attention") ||
        !r.require(w <= std::numeric_limits<int32_t>::max(), "model.sliding_window",
                   r.shown("model.sliding_window", w) + " is too large",
                   "positions are 32-bit; use null for full attention"))
      return r.issue;
  }
  if (!r.positive(m.vocab_size, "model.vocab_size") || !r.positive(m.hidden_size, "model.hidden_size") ||
      !r.positive(m.num_layers, "model.num_layers") || !r.at_most(m.num_layers, kMaxLayers, "model.num_layers") ||
      !r.positive(m.num_heads, "model.num_heads") ||
      !r.divides(m.num_heads, "model.num_heads", m.hidden_size, "model.hidden_size",
                 "choose a divisor of " + str(m.hidden_size)) ||
      !r.positive(m.num_kv_heads, "model.num_kv_heads") ||
      !r.divides(m.num_kv_heads, "model.num_kv_heads", m.num_heads, "model.num_heads",
                 "choose a divisor of " + str(m.num_heads) +
                     " (grouped-query attention shares each KV head among num_heads/num_kv_heads query heads)") ||
      !r.require(m.head_dim() % 2 == 0, "model.num_heads",
                 "head dimension " + r.name("model.hidden_size") + "/" + r.name("model.num_heads") + " = " +
                     str(m.hidden_size) + "/" + str(m.num_heads) + " = " + str(m.head_dim()) + " is odd",
                 "RoPE rotates pairs of dimensions, so choose hidden_size and num_heads with an even quotient",
                 {"model.hidden_size"}) ||
      !r.positive(m.ffn_hidden_size, "model.ffn_hidden_size") || !r.positive(m.rope_theta, "model.rope_theta") ||
      !r.positive(m.norm_eps, "model.norm_eps") || !r.positive(m.init_std, "model.init_std"))
    return r.issue;
  // LLaMA 3's RoPE scaling; its keys are unused without it, like Mixtral's below.
  if (m.rope_scaling == RopeScaling::Llama3 &&
      !(r.require(m.rope_scaling_factor >= 1, "model.rope_scaling_factor",
                  r.shown("model.rope_scaling_factor", m.rope_scaling_factor) + " is less than 1",
                  "the long wavelengths are divided by it; LLaMA 3.1 uses 8, LLaMA 3.2 32") &&
        r.positive(m.rope_low_freq_factor, "model.rope_low_freq_factor") &&
        r.require(m.rope_high_freq_factor > m.rope_low_freq_factor, "model.rope_high_freq_factor",
                  r.shown("model.rope_high_freq_factor", m.rope_high_freq_factor) + " is not above " +
                      r.name("model.rope_low_freq_factor") + " " +
                      r.shown("model.rope_low_freq_factor", m.rope_low_freq_factor),
                  "the blended band lies between the two (LLaMA 3.1: 1 and 4)", {"model.rope_low_freq_factor"}) &&
        r.positive(m.rope_original_max_positions, "model.rope_original_max_positions")))
    return r.issue;
  // Mixtral (Jiang et al. 2024). Its keys are read but unused for other
  // architectures (the effective config writes every key, so they cannot be
  // refused there).
  if (m.moe()) {
    r.positive(m.num_experts, "model.num_experts") && r.at_most(m.num_experts, kMaxExperts, "model.num_experts") &&
        r.require(m.experts_per_token >= 1 && m.experts_per_token <= m.num_experts, "model.experts_per_token",
                  r.shown("model.experts_per_token", m.experts_per_token) + " is outside [1, " +
                      r.name("model.num_experts") + " = " + str(m.num_experts) + "]",
                  "choose how many experts each token runs, e.g. 2 as Mixtral", {"model.num_experts"}) &&
        r.require(m.router_aux_loss_coef >= 0, "model.router_aux_loss_coef",
                  r.shown("model.router_aux_loss_coef", m.router_aux_loss_coef) + " is negative",
                  "it must be 0 or more (Mixtral uses 0.02, Hugging Face defaults to 0.001)");
  }
  return r.issue;
}

std::optional<ModelIssue> layout_issue(const ModelShape& m, const ParallelDegrees& p, const KeyWording& wording) {
  Rules r(wording);
  if (!r.positive(int64_t{p.tp}, "parallel.tp") || !r.positive(int64_t{p.pp}, "parallel.pp") ||
      !r.positive(int64_t{p.hdp}, "parallel.hdp") || !r.positive(int64_t{p.ep}, "parallel.ep") ||
      !r.positive(int64_t{p.vpp}, "parallel.vpp"))
    return r.issue;
  r.require(tp_divides_kv_heads(m.kv_heads, p.tp), "parallel.tp",
            r.shown("parallel.tp", int64_t{p.tp}) + " does not divide " + r.named("model.num_kv_heads", m.kv_heads),
            "tensor parallelism splits the key/value heads across ranks; choose a divisor of " + str(m.kv_heads),
            {"model.num_kv_heads"}) &&
      r.divides(p.tp, "parallel.tp", m.heads, "model.num_heads",
                "tensor parallelism splits the query heads across ranks; choose a divisor of " + str(m.heads)) &&
      r.divides(p.tp, "parallel.tp", m.ffn, "model.ffn_hidden_size",
                "tensor parallelism splits the MLP columns across ranks; choose a divisor of " + str(m.ffn)) &&
      r.require(m.vocab >= p.tp, "parallel.tp",
                r.shown("parallel.tp", int64_t{p.tp}) + " exceeds " + r.name("model.vocab_size"),
                "every tensor-parallel rank needs a slice of the vocabulary", {"model.vocab_size"}) &&
      r.require(m.layers >= p.pp, "parallel.pp",
                r.shown("parallel.pp", int64_t{p.pp}) + " is more than " + r.named("model.num_layers", m.layers),
                "every pipeline stage needs at least one layer; choose pp <= " + str(m.layers), {"model.num_layers"}) &&
      // Interleaved 1F1B (planning/pipeline_schedule.h): pp x vpp virtual stages.
      r.require(p.vpp == 1 || (p.pp > 1 && m.layers >= int64_t{p.pp} * p.vpp), "parallel.vpp",
                r.shown("parallel.vpp", int64_t{p.vpp}) + " model chunks per stage need parallel.pp > 1 and pp x vpp <= " +
                    r.named("model.num_layers", m.layers),
                "interleaved 1F1B gives each of pp x vpp virtual stages at least one layer; choose vpp 1 or pp > 1 "
                "with pp x vpp <= " + str(m.layers),
                {"parallel.pp", "model.num_layers"}) &&
      // Expert parallelism subdivides hdp (spec/parallel_degrees.h) and shares out
      // whole experts.
      r.require(p.ep == 1 || m.experts > 1, "parallel.ep",
                r.shown("parallel.ep", int64_t{p.ep}) + " needs a mixture of experts, and the model is dense",
                "expert parallelism spreads a mixture of experts; use model.arch: mixtral or parallel.ep: 1",
                {"model.arch"}) &&
      r.divides(p.ep, "parallel.ep", p.hdp, "parallel.hdp",
                "an expert-parallel group is ep of the hdp ranks; choose a divisor of " + str(p.hdp)) &&
      r.divides(p.ep, "parallel.ep", m.experts, "model.num_experts",
                "every rank of an expert-parallel group holds num_experts / ep whole experts; choose a divisor of " +
                    str(m.experts));
  return r.issue;
}

}  // namespace hdp
