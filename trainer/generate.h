#pragma once
// `trainer generate CHECKPOINT --prompt TEXT`: text continued by a checkpoint.
//
// The checkpoint (any layout) is loaded whole into one process. The prompt runs
// through the decoder once, filling a key/value cache (model/cached_decoder.h);
// each new token then costs one row through the layers and one query against the
// cache. Positions stay below data.max_seq_len, the context the model trained
// with: when the cache is full it restarts from the last half context. After the
// final norm and the LM head of the last position, the next token is the argmax
// (temperature 0) or drawn from softmax(logits / temperature) cut to the smallest
// set of tokens whose probability reaches top_p, from base/rng.h's stream for `seed`.

#include <cstdint>
#include <string>
#include <vector>

namespace hdp {

struct GenerateOptions {
  // "": the checkpoint's own tokenizer (checkpoint/tokenizer_copy.h); a tokenizer.model or
  // tokenizer.json: that one, which must be the checkpoint's when it records one.
  std::string tokenizer;
  int64_t max_new_tokens = 128;
  double temperature = 0;       // 0: greedy
  double top_p = 1.0;
  uint64_t seed = 1;
  int64_t threads = 0;          // 0: every core
};

struct GenerateResult {
  std::string checkpoint;       // the step directory used
  std::string tokenizer;        // the identity of the tokenizer used
  std::vector<uint32_t> prompt_ids, new_ids;
  std::string text;             // the new tokens decoded
  bool stopped_at_eos = false;
  double seconds = 0;
};

GenerateResult generate_text(const std::string& checkpoint, const std::string& prompt, const GenerateOptions& options);

}  // namespace hdp
