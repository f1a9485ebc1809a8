#include "trainer/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "base/rng.h"
#include "data/tokenizer.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/runtime.h"
#include "trainer/checkpoint.h"
#include "trainer/command_line.h"
#include "trainer/config.h"

namespace hdp {

GenerateResult generate_text(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& options) {
  if (options.temperature < 0) throw UsageError("--temperature must be 0 (greedy) or more");
  if (!(options.top_p > 0 && options.top_p <= 1)) throw UsageError("--top-p must be in (0, 1]");
  const auto start = std::chrono::steady_clock::now();
  GenerateResult result;
  result.checkpoint = checkpoint_or_latest(checkpoint);
  const Config config = parse_config_text(checkpoint_config(result.checkpoint),
                                          result.checkpoint + "/manifest.yaml (config)", {}, /*check_files=*/false);
  const ModelConfig& m = config.model;
  configure_threads(options.threads, ProcessInfo{});
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
  if (tokenizer->vocab_size() > static_cast<uint64_t>(m.vocab_size))
    throw UsageError("the tokenizer's vocabulary (" + std::to_string(tokenizer->vocab_size()) +
                     ") is larger than the model's model.vocab_size " + std::to_string(m.vocab_size));

  // Embedding and layers as one pipeline "stage" without the head: its output is
  // the last layer's hidden states, to which the final norm and head are applied
  // for the last position only.
  const int64_t context = std::max<int64_t>(config.data.max_seq_len, 2);
  ModelPartition decoder;
  decoder.has_head = false;
  LlamaModel model(m, context, decoder);
  load_checkpoint(result.checkpoint, model, nullptr);
  std::vector<float> final_norm, head;
  const std::string head_name = m.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  read_whole_tensors(result.checkpoint, [&](const CheckpointTensorInfo& t, std::vector<float>&& values) {
    if (t.name == "model.norm.weight") final_norm = std::move(values);
    if (t.name == head_name) head = std::move(values);
  });
  if (final_norm.size() != static_cast<size_t>(m.hidden_size) || head.size() != static_cast<size_t>(m.vocab_size * m.hidden_size))
    throw CheckpointError(result.checkpoint + ": the final norm or the LM head is missing");

  std::vector<uint32_t> ids;
  if (tokenizer->adds_bos()) ids.push_back(tokenizer->bos_id());
  tokenizer->encode_append(prompt, ids);
  if (ids.empty()) throw UsageError("--prompt is empty and the tokenizer adds no BOS: nothing to continue");
  result.prompt_ids = ids;

  Rng rng(options.seed, /*stream=*/0x67656e);  // "gen"
  const int64_t H = m.hidden_size, V = m.vocab_size;
  std::vector<float> normed(H), rstd(1), logits(V);
  std::vector<int32_t> tokens, targets, positions, cu_seqlens;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    // The last `context` tokens: positions beyond what the model trained on are not used.
    const size_t first = ids.size() > static_cast<size_t>(context) ? ids.size() - context : 0;
    tokens.assign(ids.begin() + static_cast<long>(first), ids.end());
    const int32_t n = static_cast<int32_t>(tokens.size());
    targets.assign(n, -1);
    positions.resize(n);
    std::iota(positions.begin(), positions.end(), 0);
    cu_seqlens = {0, n};
    MicroBatchView view;
    view.tokens = tokens;
    view.targets = targets;
    view.positions = positions;
    view.cu_seqlens = cu_seqlens;
    model.set_batch(0, view);
    model.forward(0, 1.0f, /*with_backward=*/false);
    const Tensor last = model.output_activation(0).rows(n - 1, n);
    rmsnorm_forward(Tensor(normed.data(), {1, H}), Tensor(rstd.data(), {1}), last, Tensor(final_norm.data(), {H}),
                    static_cast<float>(m.norm_eps));
    linear_forward(Tensor(logits.data(), {1, V}), Tensor(normed.data(), {1, H}), Tensor(head.data(), {V, H}));

    uint32_t next = 0;
    if (options.temperature == 0) {
      next = static_cast<uint32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      const double top = *std::max_element(logits.begin(), logits.end());
      std::vector<std::pair<double, uint32_t>> p(V);
      double total = 0;
      for (int64_t v = 0; v < V; ++v) {
        p[v] = {std::exp((logits[v] - top) / options.temperature), static_cast<uint32_t>(v)};
        total += p[v].first;
      }
      std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      // The smallest prefix whose probability reaches top_p.
      size_t keep = 0;
      double mass = 0;
      while (keep < p.size() && (keep == 0 || mass < options.top_p * total)) mass += p[keep++].first;
      const double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53 * mass;
      double acc = 0;
      next = p[keep - 1].second;
      for (size_t k = 0; k < keep; ++k) {
        acc += p[k].first;
        if (u < acc) {
          next = p[k].second;
          break;
        }
      }
    }
    if (next == tokenizer->eos_id()) {
      result.stopped_at_eos = true;
      break;
    }
    ids.push_back(next);
    result.new_ids.push_back(next);
  }
  // Ids the tokenizer cannot decode (the model's vocabulary may be larger) end the text.
  std::vector<uint32_t> decodable;
  for (uint32_t id : result.new_ids) {
    if (id >= tokenizer->vocab_size()) break;
    decodable.push_back(id);
  }
  result.text = tokenizer->decode(decodable);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace hdp
