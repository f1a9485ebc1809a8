// One line of a JSON Lines corpus (data/json.h: the strict parser prepare-data
// and make-corpus run on every line), its "text" member taken out and unescaped.
#include "data/json.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return hdp::fuzz::accept_or_refuse([&] { hdp::json_object_string_field(hdp::fuzz::as_text(data, size), "text"); });
}
