// The HDF5 token dataset's structure and attributes (data/dataset.h: TokenDataset,
// format in docs/dataset-format.md), as data.format hdf5 opens them, then every
// document read. Structure-aware: the input is a recipe that this target writes
// as a well-formed HDF5 file through libhdf5, so the fuzzing exercises our checks
// of what the file declares (types, ranks, extents against stored bytes, offsets,
// attribute types and values) rather than libhdf5's own parsing of file bytes,
// which is not ours to fix and not instrumented here.
//
// The recipe, read front to back (hdp::fuzz::ByteReader; missing bytes read as 0):
//   for each attribute of kAttributes: kind (u8) and its value
//     kind % 8: 0 absent, 1 uint64 (u64), 2 int64 (u64), 3 uint32 (u64, truncated),
//     4 fixed-length string (u8 length, bytes), 5 variable-length string (same),
//     6 uint64[2] (two u64), 7 float64 (u64 bits)
//   for each dataset of kDatasets: kind (u8), extent (u64), count (u8), count x u64
//     kind % 6: 0 absent, 1 uint32, 2 uint64, 3 int32, 4 uint32 of shape [extent, 1],
//     5 a group of that name. Chunked by 16 elements, unlimited, so an extent up to
//     2^40 costs nothing to write; the first min(count, extent) values are written.
#include <hdf5.h>

#include <cstring>

#include "data/dataset.h"
#include "data/hdf5_lock.h"
#include "fuzz/fuzz_input.h"

namespace {

using hdp::H5Handle;
using hdp::h5check;
using hdp::h5check_status;

constexpr const char* kAttributes[] = {"format_version", "vocab_size", "tokenizer", "bos_id", "eos_id", "max_token_id"};
constexpr const char* kDatasets[] = {"tokens", "doc_offsets"};
constexpr uint64_t kMaxExtent = uint64_t{1} << 40;
constexpr hsize_t kChunk = 16;

void write_attribute(hid_t file, const char* name, hdp::fuzz::ByteReader& in) {
  const uint8_t kind = in.u8() % 8;
  if (kind == 0) return;
  if (kind == 4 || kind == 5) {
    std::string value = in.bytes(in.u8());
    H5Handle type = hdp::h5_type(H5Tcopy(H5T_C_S1), name);
    h5check_status(H5Tset_size(type.get(), kind == 5 ? H5T_VARIABLE : std::max<size_t>(value.size(), 1)), name);
    H5Handle space = hdp::h5_space(H5Screate(H5S_SCALAR), name);
    H5Handle attr = hdp::h5_attr(H5Acreate2(file, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), name);
    value.resize(std::max<size_t>(value.size(), 1), '\0');
    const char* text = value.c_str();
    h5check_status(H5Awrite(attr.get(), type.get(), kind == 5 ? static_cast<const void*>(&text) : value.data()), name);
    return;
  }
  const uint64_t values[2] = {in.u64(), kind == 6 ? in.u64() : 0};
  const hsize_t two = 2;
  H5Handle space = hdp::h5_space(kind == 6 ? H5Screate_simple(1, &two, nullptr) : H5Screate(H5S_SCALAR), name);
  const hid_t file_type = kind == 2 ? H5T_STD_I64LE : kind == 3 ? H5T_STD_U32LE : kind == 7 ? H5T_IEEE_F64LE : H5T_STD_U64LE;
  const hid_t memory_type = kind == 2 ? H5T_NATIVE_INT64 : kind == 7 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_UINT64;
  H5Handle attr = hdp::h5_attr(H5Acreate2(file, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), name);
  h5check_status(H5Awrite(attr.get(), memory_type, values), name);
}

void write_dataset(hid_t file, const char* name, hdp::fuzz::ByteReader& in) {
  const uint8_t kind = in.u8() % 6;
  const uint64_t extent = in.u64() % (kMaxExtent + 1);
  const uint64_t count = std::min<uint64_t>(in.u8(), extent);
  std::vector<uint64_t> values(count);
  for (uint64_t& v : values) v = in.u64();
  if (kind == 0) return;
  if (kind == 5) {
    H5Handle group(h5check(H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name), H5Gclose);
    return;
  }
  const int rank = kind == 4 ? 2 : 1;
  const hsize_t dims[2] = {extent, 1}, max_dims[2] = {H5S_UNLIMITED, H5S_UNLIMITED}, chunk[2] = {kChunk, 1};
  H5Handle space = hdp::h5_space(H5Screate_simple(rank, dims, max_dims), name);
  H5Handle create = hdp::h5_plist(H5Pcreate(H5P_DATASET_CREATE), name);
  h5check_status(H5Pset_chunk(create.get(), rank, chunk), name);
  const hid_t type = kind == 2 ? H5T_STD_U64LE : kind == 3 ? H5T_STD_I32LE : H5T_STD_U32LE;
  H5Handle dataset = hdp::h5_dataset(
      H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, create.get(), H5P_DEFAULT), name);
  if (count == 0) return;
  const hsize_t start[2] = {0, 0}, written[2] = {count, 1};
  h5check_status(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, written, nullptr), name);
  H5Handle memory = hdp::h5_space(H5Screate_simple(rank, written, nullptr), name);
  h5check_status(H5Dwrite(dataset.get(), H5T_NATIVE_UINT64, memory.get(), space.get(), H5P_DEFAULT, values.data()), name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = (hdp::fuzz::scratch_dir() / "dataset.h5").string();
  hdp::fuzz::ByteReader in(data, size);
  {
    hdp::Hdf5Lock lock;
    H5Handle file = hdp::h5_file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), path);
    for (const char* name : kAttributes) write_attribute(file.get(), name, in);
    for (const char* name : kDatasets) write_dataset(file.get(), name, in);
    file.close(path);
  }
  return hdp::fuzz::accept_or_refuse([&] {
    const hdp::TokenDataset dataset(path);
    for (int64_t d = 0; d < dataset.num_documents(); ++d) dataset.read_document(d);
  });
}
