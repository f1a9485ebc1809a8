// A Megatron dataset (data/megatron.h): PREFIX.idx and PREFIX.bin opened as
// data.format megatron opens them, then every document read. The input is the
// .idx followed by the .bin: the .idx is as long as its header's counts say
// (34 + 12 S + 8 D bytes) when the input holds that much, else the whole input
// (the .bin then empty), so a seed is the two files concatenated.
#include "data/dataset.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kHeaderBytes = 34;
  hdp::fuzz::ByteReader header(data, size);
  header.bytes(9 + 8 + 1);  // magic, version, dtype
  const uint64_t sequences = header.u64(), documents = header.u64();
  size_t idx_bytes = size;
  if (size >= kHeaderBytes && sequences <= size && documents <= size &&
      kHeaderBytes + 12 * sequences + 8 * documents <= size)
    idx_bytes = kHeaderBytes + 12 * sequences + 8 * documents;
  const std::string_view input = hdp::fuzz::as_text(data, size);
  hdp::fuzz::write_input("data.idx", input.substr(0, idx_bytes));
  hdp::fuzz::write_input("data.bin", input.substr(idx_bytes));
  const std::string prefix = (hdp::fuzz::scratch_dir() / "data").string();
  return hdp::fuzz::accept_or_refuse([&] {
    const hdp::TokenDataset dataset(prefix, hdp::DatasetFormat::Megatron);
    for (int64_t d = 0; d < dataset.num_documents(); ++d) dataset.read_document(d);
  });
}
