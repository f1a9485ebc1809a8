#pragma once
// Hugging Face model directories in and out (docs/checkpoint-format.md,
// "Hugging Face interchange"): `trainer import-hf` and `trainer export-hf`.
//
// A Hugging Face LLaMA, Mistral or Mixtral directory is config.json (LlamaConfig,
// MistralConfig, MixtralConfig), optionally generation_config.json, and the weights
// as model.safetensors or as shards model-0000i-of-0000n.safetensors listed in
// model.safetensors.index.json. Our parameters already carry the Hugging Face names
// and [out, in] shapes (model/model.h; Mixtral's experts as
// model.layers.N.block_sparse_moe.experts.E.w1/w2/w3.weight and its router as
// .block_sparse_moe.gate.weight, the names transformers 5 saves too), so the weights
// map one to one; only the config is translated.
//
// Anything in config.json that would change the numerics and that we do not
// implement (a RoPE type other than default and llama3, a partial rotary factor,
// attention or MLP biases, another activation, another architecture, router
// jitter) is refused with a ConfigError naming the file and the key, never ignored.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "spec/model_config.h"
#include "checkpoint/safetensors.h"

namespace hdp {

// What config.json says, in our terms.
struct HfModelConfig {
  ModelConfig model;
  int64_t max_position_embeddings = 0;
  std::optional<int64_t> bos_token_id, eos_token_id;
};

// Reads and checks HF_DIR/config.json. Throws ConfigError "<file>: <key>: <problem>; <valid>".
HfModelConfig read_hf_config(const std::string& config_json);

// Writes a step-0, weights-only checkpoint of HF_DIR's model into
// checkpoint_dir/step-00000000 (which train.init_from takes under any layout)
// and returns its path. The stored config holds the model keys from config.json,
// data.max_seq_len = max_position_embeddings and `overrides` ("key=value", as
// train's --set; of the model keys only init_std and router_aux_loss_coef,
// which steer training only, may be overridden: config/model_agreement.h). Refuses a
// checkpoint_dir that is not empty.
std::string import_hf(const std::string& hf_dir, const std::string& checkpoint_dir,
                      const std::vector<std::string>& overrides);

struct HfExportOptions {
  SafetensorsDtype dtype = SafetensorsDtype::BF16;  // F32 or BF16
  uint64_t max_shard_bytes = 5'000'000'000;         // larger models are sharded, with the index
  // Written to config.json and generation_config.json. Default: the byte-level
  // tokenizer's 256 and 257 for a 258-entry vocabulary; other vocabularies need them given.
  std::optional<int64_t> bos_token_id, eos_token_id;
};

// Writes config.json, generation_config.json and the safetensors weights of a
// checkpoint (a step directory, or a checkpoint directory whose newest complete
// checkpoint is taken) into output_dir, which must not hold a model already.
// Returns the checkpoint path used.
std::string export_hf(const std::string& checkpoint, const std::string& output_dir, const HfExportOptions& options);

}  // namespace hdp
