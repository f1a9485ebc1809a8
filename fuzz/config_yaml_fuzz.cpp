// A training config (config/config.h: parse_config_text, what load_config runs on
// a file's text): YAML, the schema's keys and rules and the checks between keys.
// Files the config names are not looked for (check_files = false).
#include "config/config.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(hdp::fuzz::as_text(data, size));
  return hdp::fuzz::accept_or_refuse([&] { hdp::parse_config_text(text, "fuzz.yaml", {}, /*check_files=*/false); });
}
