#include "trainer/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/rng.h"
#include "data/tokenizer.h"
#include "kernels/ops.h"
#include "model/cached_decoder.h"
#include "model/model.h"
#include "parallel/runtime.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "checkpoint/protocol.h"
#include "checkpoint/tokenizer_copy.h"
#include "trainer/command_line.h"
#include "config/config.h"

namespace hdp {

GenerateResult generate_text(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& options) {
  if (options.temperature < 0) throw UsageError("--temperature must be 0 (greedy) or more");
  if (!(options.top_p > 0 && options.top_p <= 1)) throw UsageError("--top-p must be in (0, 1]");
  const auto start = std::chrono::steady_clock::now();
  GenerateResult result;
  result.checkpoint = checkpoint_or_latest(checkpoint);
  const Manifest manifest = read_manifest(result.checkpoint);
  const Config config = parse_manifest_config(manifest.config, result.checkpoint);
  const ModelConfig& m = config.model;
  configure_threads(options.threads, ProcessInfo{});
  const std::unique_ptr<Tokenizer> tokenizer =
      checkpoint_tokenizer(result.checkpoint, manifest, options.tokenizer, m.vocab_size);
  result.tokenizer = tokenizer->name();
  if (tokenizer->vocab_size() > static_cast<uint64_t>(m.vocab_size))
    throw UsageError("the tokenizer's vocabulary (" + std::to_string(tokenizer->vocab_size()) +
                     ") is larger than the model's model.vocab_size " + std::to_string(m.vocab_size));

  // The whole model holds the weights; the cached decoder runs them one new token at
  // a time (the model's own activation memory is not used, hence a capacity of 1).
  const int64_t context = std::max<int64_t>(config.data.max_seq_len, 2);
  LlamaModel model(m, /*capacity_tokens=*/1);
  load_checkpoint(result.checkpoint, model, nullptr);
  CachedDecoder decoder(model, context);

  std::vector<uint32_t> ids;
  if (tokenizer->adds_bos()) ids.push_back(tokenizer->bos_id());
  tokenizer->encode_append(prompt, ids);
  if (ids.empty()) throw UsageError("--prompt is empty and the tokenizer adds no BOS: nothing to continue");
  result.prompt_ids = ids;

  Rng rng(options.seed, /*stream=*/0x67656e);  // "gen"
  const int64_t V = m.vocab_size;
  std::vector<int32_t> pending;  // tokens not yet in the cache
  const auto first_kept = [&](size_t keep) { return ids.size() > keep ? ids.size() - keep : size_t{0}; };
  pending.assign(ids.begin() + static_cast<long>(first_kept(static_cast<size_t>(context))), ids.end());
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    // Positions beyond what the model trained on are not used: when the cache is
    // full, it restarts from the last half context at position 0.
    if (decoder.length() + static_cast<int64_t>(pending.size()) > context) {
      decoder.clear();
      pending.assign(ids.begin() + static_cast<long>(first_kept(static_cast<size_t>(context / 2))), ids.end());
    }
    const std::span<const float> logits = decoder.append(pending);
    pending.clear();

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
    pending.push_back(static_cast<int32_t>(next));
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
