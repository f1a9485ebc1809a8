#include "trainer/evaluate.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>

#include "model/model.h"
#include "parallel/runtime.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "checkpoint/protocol.h"
#include "config/config.h"

namespace hdp {

EvalResult evaluate_checkpoint(const std::string& checkpoint, const std::string& data, const EvalOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  EvalResult result;
  result.checkpoint = checkpoint_or_latest(checkpoint);
  Config config = parse_config_text(checkpoint_config(result.checkpoint), result.checkpoint + "/manifest.yaml (config)",
                                    {}, /*check_files=*/false);
  const int64_t max_seq_len = options.max_seq_len > 0 ? options.max_seq_len : config.data.max_seq_len;
  configure_threads(options.threads, ProcessInfo{});

  const TokenDataset dataset = TokenDataset::open(data, options.format);
  config.data.path = data;
  validate_dataset_vocab(config, static_cast<int64_t>(dataset.vocab_size()), dataset.max_token_id());

  // One micro-batch holds at least one whole sequence.
  const int64_t capacity = std::max<int64_t>(max_seq_len, 4096);
  LlamaModel model(config.model, capacity);
  result.step = load_checkpoint(result.checkpoint, model, nullptr).step;

  std::vector<int32_t> tokens, targets, positions, cu_seqlens{0};
  double loss_sum = 0;
  auto flush = [&] {
    if (tokens.empty()) return;
    MicroBatchView view;
    view.tokens = tokens;
    view.targets = targets;
    view.positions = positions;
    view.cu_seqlens = cu_seqlens;
    loss_sum += model.forward_loss(view);
    tokens.clear(), targets.clear(), positions.clear(), cu_seqlens.assign(1, 0);
  };
  const int64_t documents = options.max_documents > 0 ? std::min(options.max_documents, dataset.num_documents())
                                                      : dataset.num_documents();
  std::vector<int32_t> piece;
  for (int64_t d = 0; d < documents; ++d) {
    const int64_t length = dataset.document_length(d);
    for (int64_t offset = 0; offset < length; offset += max_seq_len) {
      const int64_t n = std::min(max_seq_len, length - offset);
      if (n < 2) continue;  // nothing to predict
      piece.resize(static_cast<size_t>(n));
      dataset.read(d, offset, n, piece.data());
      if (static_cast<int64_t>(tokens.size()) + n > capacity) flush();
      for (int64_t i = 0; i < n; ++i) {
        tokens.push_back(piece[i]);
        targets.push_back(i + 1 < n ? piece[i + 1] : -1);
        positions.push_back(static_cast<int32_t>(i));
      }
      cu_seqlens.push_back(static_cast<int32_t>(tokens.size()));
      result.sequences += 1;
      result.predicted_tokens += n - 1;
    }
    result.documents += 1;
  }
  flush();
  if (result.predicted_tokens == 0) throw DatasetError("dataset '" + data + "': no sequence of 2 or more tokens to evaluate");
  result.loss = loss_sum / static_cast<double>(result.predicted_tokens);
  result.perplexity = std::exp(result.loss);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace hdp
