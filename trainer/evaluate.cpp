#include "trainer/evaluate.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>

#include "base/progress_meter.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "checkpoint/protocol.h"
#include "checkpoint/tokenizer_copy.h"
#include "config/config.h"
#include "data/materialize.h"
#include "model/model.h"
#include "parallel/runtime.h"

namespace hdp {

EvalResult evaluate_checkpoint(const std::string& checkpoint, const std::string& data, const EvalOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  EvalResult result;
  result.checkpoint = checkpoint_or_latest(checkpoint);
  const Manifest manifest = read_manifest(result.checkpoint);
  Config config = parse_manifest_config(manifest.config, result.checkpoint);
  const int64_t max_seq_len = options.max_seq_len > 0 ? options.max_seq_len : config.data.max_seq_len;
  configure_threads(options.threads, ProcessInfo{});

  const TokenDataset dataset = TokenDataset::open(data, options.format);
  check_data_tokenizer(result.checkpoint, manifest, data, dataset.tokenizer(), "eval --data");
  config.data.path = data;
  validate_dataset_vocab(config, static_cast<int64_t>(dataset.vocab_size()), dataset.max_token_id());

  // One micro-batch holds at least one whole sequence.
  const int64_t capacity = std::max<int64_t>(max_seq_len, 4096);
  LlamaModel model(config.model, capacity);
  result.step = load_checkpoint(result.checkpoint, model, nullptr).step;

  // Sequences are cut as training cuts them and run in order, as many whole ones to
  // a micro-batch as fit.
  const TokenReader read = dataset_reader(dataset);
  std::vector<SequenceSpan> micro_batch;
  int64_t micro_batch_tokens = 0;
  double loss_sum = 0;
  auto flush = [&] {
    if (micro_batch.empty()) return;
    const PackedMicroBatch mb = materialize_sequences(read, micro_batch);
    loss_sum += model.forward_loss(MicroBatchView{mb.tokens, mb.targets, mb.positions, mb.cu_seqlens});
    micro_batch.clear();
    micro_batch_tokens = 0;
  };
  const int64_t documents = options.max_documents > 0 ? std::min(options.max_documents, dataset.num_documents())
                                                      : dataset.num_documents();
  ProgressMeter meter;  // a line at least every 10 s: a large dataset takes minutes
  for (int64_t d = 0; d < documents; ++d) {
    const int64_t length = dataset.document_length(d);
    for (int64_t offset = 0, n = 0; offset < length; offset += n) {
      n = sequence_length_at(length, offset, max_seq_len);
      if (n < 2) continue;  // nothing to predict
      if (micro_batch_tokens + n > capacity) flush();
      micro_batch.push_back({d, offset, n});
      micro_batch_tokens += n;
      result.sequences += 1;
      result.predicted_tokens += n - 1;
    }
    result.documents += 1;
    if (meter.due()) {
      spdlog::info("eval: {} of {} documents, {} tokens predicted, {}", result.documents, documents,
                   result.predicted_tokens,
                   meter.elapsed_and_left(static_cast<double>(result.documents) / static_cast<double>(documents)));
    }
  }
  flush();
  if (result.predicted_tokens == 0) throw DatasetError("dataset '" + data + "': no sequence of 2 or more tokens to evaluate");
  result.loss = loss_sum / static_cast<double>(result.predicted_tokens);
  result.perplexity = std::exp(result.loss);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace hdp
