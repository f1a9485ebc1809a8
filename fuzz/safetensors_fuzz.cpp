// A safetensors file (checkpoint/safetensors.h): the header checked whole on
// opening, then every tensor read as float32, as `trainer import-hf` reads them.
#include "checkpoint/safetensors.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = hdp::fuzz::write_input("model.safetensors", hdp::fuzz::as_text(data, size));
  return hdp::fuzz::accept_or_refuse([&] {
    hdp::SafetensorsReader reader(path);
    for (const hdp::SafetensorsTensor& tensor : reader.tensors()) reader.read_floats(tensor);
  });
}
