#include "data/megatron.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

namespace hdp {

static_assert(std::endian::native == std::endian::little, "the Megatron files are read and written as in memory");

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

[[noreturn]] void fail(const std::string& prefix, const std::string& message) {
  throw DatasetError("dataset '" + prefix + "': " + message);
}

bool is_integer(MegatronDtype d) { return d != MegatronDtype::F32 && d != MegatronDtype::F64; }

}  // namespace

size_t megatron_dtype_bytes(MegatronDtype dtype) {
  switch (dtype) {
    case MegatronDtype::U8:
    case MegatronDtype::I8: return 1;
    case MegatronDtype::I16:
    case MegatronDtype::U16: return 2;
    case MegatronDtype::I32:
    case MegatronDtype::F32: return 4;
    case MegatronDtype::I64:
    case MegatronDtype::F64: return 8;
  }
  return 0;
}

MegatronDtype megatron_dtype_for_vocab(uint64_t vocab_size) {
  return vocab_size < 65500 ? MegatronDtype::U16 : MegatronDtype::I32;
}

MegatronIndex read_megatron_index(const std::string& prefix) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  std::error_code ec;
  if (!fs::is_regular_file(idx, ec)) fail(prefix, idx + " does not exist (data.format megatron names the PREFIX of PREFIX.bin and PREFIX.idx)");
  if (!fs::is_regular_file(bin, ec)) fail(prefix, bin + " does not exist");
  const uint64_t idx_size = fs::file_size(idx, ec), bin_size = fs::file_size(bin, ec);
  std::ifstream in(idx, std::ios::binary);
  if (!in) fail(prefix, idx + ": cannot open: " + std::strerror(errno));
  if (idx_size < kHeaderBytes) fail(prefix, idx + ": " + std::to_string(idx_size) + " bytes, shorter than the 34-byte header: truncated");
  char magic[9];
  in.read(magic, 9);
  if (std::memcmp(magic, kMagic, 9) != 0) fail(prefix, idx + ": not a Megatron index (magic is not MMIDIDX)");
  uint64_t version = 0, sequences = 0, documents = 0;
  uint8_t code = 0;
  in.read(reinterpret_cast<char*>(&version), 8);
  in.read(reinterpret_cast<char*>(&code), 1);
  in.read(reinterpret_cast<char*>(&sequences), 8);
  in.read(reinterpret_cast<char*>(&documents), 8);
  if (version != 1) fail(prefix, idx + ": version " + std::to_string(version) + ", this build reads version 1");
  MegatronIndex index;
  index.dtype = static_cast<MegatronDtype>(code);
  if (code < 1 || code > 8) fail(prefix, idx + ": unknown dtype code " + std::to_string(code) + " (1-8 are defined)");
  if (!is_integer(index.dtype)) fail(prefix, idx + ": dtype code " + std::to_string(code) + " is a float type; tokens are integers");
  const uint64_t limit = idx_size / 4;  // bounds the counts before any arithmetic on them
  if (sequences > limit || documents > limit || kHeaderBytes + 12 * sequences + 8 * documents != idx_size)
    fail(prefix, idx + ": " + std::to_string(sequences) + " sequences and " + std::to_string(documents) +
                     " document indices need " + std::to_string(kHeaderBytes + 12 * sequences + 8 * documents) +
                     " bytes, the file has " + std::to_string(idx_size) + " (truncated, or a multimodal index)");
  index.sequence_lengths.resize(sequences);
  index.sequence_pointers.resize(sequences);
  index.document_indices.resize(documents);
  in.read(reinterpret_cast<char*>(index.sequence_lengths.data()), static_cast<std::streamsize>(4 * sequences));
  in.read(reinterpret_cast<char*>(index.sequence_pointers.data()), static_cast<std::streamsize>(8 * sequences));
  in.read(reinterpret_cast<char*>(index.document_indices.data()), static_cast<std::streamsize>(8 * documents));
  if (!in) fail(prefix, idx + ": read error");

  const int64_t item = static_cast<int64_t>(megatron_dtype_bytes(index.dtype));
  int64_t expected = 0;
  for (uint64_t s = 0; s < sequences; ++s) {
    if (index.sequence_lengths[s] < 0)
      fail(prefix, idx + ": sequence " + std::to_string(s) + " has length " + std::to_string(index.sequence_lengths[s]));
    if (index.sequence_pointers[s] != expected)
      fail(prefix, idx + ": sequence " + std::to_string(s) + " starts at byte " + std::to_string(index.sequence_pointers[s]) +
                       " of " + bin + ", expected " + std::to_string(expected) + " (sequences must lie back to back)");
    expected += index.sequence_lengths[s] * item;
  }
  if (static_cast<uint64_t>(expected) != bin_size)
    fail(prefix, bin + " has " + std::to_string(bin_size) + " bytes, the index describes " + std::to_string(expected));
  if (documents == 0 || index.document_indices.front() != 0 ||
      index.document_indices.back() != static_cast<int64_t>(sequences))
    fail(prefix, idx + ": document indices must start at 0 and end at the sequence count " + std::to_string(sequences));
  for (uint64_t d = 1; d < documents; ++d)
    if (index.document_indices[d] < index.document_indices[d - 1])
      fail(prefix, idx + ": document index " + std::to_string(d) + " decreases");
  return index;
}

MegatronTokens::MegatronTokens(const std::string& prefix, MegatronDtype dtype) : dtype_(dtype) {
  const std::string bin = prefix + ".bin";
  const int fd = ::open(bin.c_str(), O_RDONLY);
  if (fd < 0) fail(prefix, bin + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail(prefix, bin + ": cannot stat");
  }
  bytes_ = static_cast<size_t>(st.st_size);
  count_ = bytes_ / megatron_dtype_bytes(dtype);
  if (bytes_ > 0) {
    void* p = mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail(prefix, bin + ": mmap failed: " + std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid
}

MegatronTokens::~MegatronTokens() {
  if (data_) munmap(const_cast<uint8_t*>(data_), bytes_);
}

void MegatronTokens::read(uint64_t first, uint64_t n, int64_t* out) const {
  const size_t item = megatron_dtype_bytes(dtype_);
  const uint8_t* p = data_ + first * item;
  for (uint64_t i = 0; i < n; ++i, p += item) {
    switch (dtype_) {
      case MegatronDtype::U8: out[i] = *p; break;
      case MegatronDtype::I8: out[i] = static_cast<int8_t>(*p); break;
      case MegatronDtype::I16: { int16_t v; std::memcpy(&v, p, 2); out[i] = v; break; }
      case MegatronDtype::U16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = v; break; }
      case MegatronDtype::I32: { int32_t v; std::memcpy(&v, p, 4); out[i] = v; break; }
      case MegatronDtype::I64: { int64_t v; std::memcpy(&v, p, 8); out[i] = v; break; }
      default: out[i] = -1; break;  // float dtypes are refused when the index is read
    }
  }
}

// ---------------------------------------------------------------------------

MegatronWriter::MegatronWriter(const std::string& prefix, uint64_t vocab_size)
    : prefix_(prefix), vocab_size_(vocab_size), dtype_(megatron_dtype_for_vocab(vocab_size)) {
  index_.dtype = dtype_;
  index_.document_indices.push_back(0);
  bin_.open(prefix + ".bin.tmp", std::ios::binary | std::ios::trunc);
  if (!bin_) fail(prefix, prefix + ".bin.tmp: cannot create: " + std::strerror(errno));
}

MegatronWriter::~MegatronWriter() {
  if (!finished_) {
    bin_.close();
    std::error_code ec;
    fs::remove(prefix_ + ".bin.tmp", ec);
    fs::remove(prefix_ + ".idx.tmp", ec);
  }
}

void MegatronWriter::append_partial(std::span<const uint32_t> tokens) {
  const size_t item = megatron_dtype_bytes(dtype_);
  std::vector<uint8_t> bytes(tokens.size() * item);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size_)
      fail(prefix_, "token id " + std::to_string(tokens[i]) + " is >= vocab_size " + std::to_string(vocab_size_));
    if (dtype_ == MegatronDtype::U16) {
      const uint16_t v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(bytes.data() + 2 * i, &v, 2);
    } else {
      const int32_t v = static_cast<int32_t>(tokens[i]);
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
  if (open_length_ + static_cast<int64_t>(tokens.size()) > std::numeric_limits<int32_t>::max())
    fail(prefix_, "a document of more than 2^31 - 1 tokens does not fit the index's int32 lengths");
  bin_.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!bin_) fail(prefix_, prefix_ + ".bin.tmp: write failed (disk full?)");
  open_length_ += static_cast<int64_t>(tokens.size());
}

int64_t MegatronWriter::end_document() {
  index_.sequence_lengths.push_back(static_cast<int32_t>(open_length_));
  index_.sequence_pointers.push_back(written_);
  written_ += open_length_ * static_cast<int64_t>(megatron_dtype_bytes(dtype_));
  open_length_ = 0;
  index_.document_indices.push_back(static_cast<int64_t>(index_.sequence_lengths.size()));
  return static_cast<int64_t>(index_.sequence_lengths.size()) - 1;
}

int64_t MegatronWriter::append(std::span<const uint32_t> tokens) {
  append_partial(tokens);
  return end_document();
}

void MegatronWriter::finish() {
  if (open_length_ > 0) end_document();
  bin_.close();
  if (!bin_) fail(prefix_, prefix_ + ".bin.tmp: closing failed (disk full?)");
  {
    std::ofstream idx(prefix_ + ".idx.tmp", std::ios::binary | std::ios::trunc);
    const uint64_t version = 1, sequences = index_.sequence_lengths.size(), documents = index_.document_indices.size();
    const uint8_t code = static_cast<uint8_t>(dtype_);
    idx.write(kMagic, 9);
    idx.write(reinterpret_cast<const char*>(&version), 8);
    idx.write(reinterpret_cast<const char*>(&code), 1);
    idx.write(reinterpret_cast<const char*>(&sequences), 8);
    idx.write(reinterpret_cast<const char*>(&documents), 8);
    idx.write(reinterpret_cast<const char*>(index_.sequence_lengths.data()), static_cast<std::streamsize>(4 * sequences));
    idx.write(reinterpret_cast<const char*>(index_.sequence_pointers.data()), static_cast<std::streamsize>(8 * sequences));
    idx.write(reinterpret_cast<const char*>(index_.document_indices.data()), static_cast<std::streamsize>(8 * documents));
    if (!(idx << std::flush)) fail(prefix_, prefix_ + ".idx.tmp: write failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(prefix_ + ".bin.tmp", prefix_ + ".bin", ec);
  if (!ec) fs::rename(prefix_ + ".idx.tmp", prefix_ + ".idx", ec);
  if (ec) fail(prefix_, "renaming the finished files failed: " + ec.message());
  finished_ = true;
}

}  // namespace hdp
