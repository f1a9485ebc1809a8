// A Hugging Face config.json (checkpoint/hf_checkpoint.h: read_hf_config), which
// `trainer import-hf` translates into our model keys and checks before building
// the model.
#include "checkpoint/hf_checkpoint.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hdp::fuzz::write_input("config.json", hdp::fuzz::as_text(data, size));
  return hdp::fuzz::accept_or_refuse([&] { hdp::read_hf_config(path); });
}
