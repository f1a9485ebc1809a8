#include "data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "data/hdf5_lock.h"
#include "data/megatron.h"

namespace hdp {

namespace fs = std::filesystem;

namespace {

// Tokens buffered by the writer before one HDF5 write (a multiple of the chunk).
constexpr size_t kWriterFlushElements = 16 * kTokenChunkElements;
// Raw-data chunk cache per open dataset file: the demo corpora fit entirely.
constexpr size_t kReaderChunkCacheBytes = 64u << 20;
constexpr size_t kReaderChunkCacheSlots = 2053;  // prime, > 8x the chunks that fit
// The most a dataset's stored bytes may expand to when read: deflate's largest
// ratio (a 258-byte match in as little as 2 bits, about 1032:1; shuffle moves
// bytes without adding any). A dataset whose declared size exceeds it holds less
// than it claims.
constexpr double kMaxCompressionRatio = 1032;

std::string type_description(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  std::string bits = std::to_string(size * 8);
  switch (cls) {
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_FLOAT: return "float" + bits;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    default: return "a non-integer type";
  }
}

constexpr const char* kTokenizerFilesGroup = "tokenizer_files";

// The tokenizer's copy: one uint8 dataset per file in the group, named by the file.
void write_tokenizer_copy(hid_t file, const TokenizerFiles& copy) {
  H5Handle group(h5check(H5Gcreate2(file, kTokenizerFilesGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                         std::string("creating group '") + kTokenizerFilesGroup + "'"),
                 H5Gclose);
  for (const TokenizerFile& f : copy.files) {
    const std::string what = std::string("'") + kTokenizerFilesGroup + "/" + f.name + "'";
    hsize_t dims[1] = {f.bytes.size()};
    H5Handle space = h5_space(H5Screate_simple(1, dims, nullptr), "dataspace of " + what);
    H5Handle dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE), "properties of " + what);
    h5check_status(H5Pset_obj_track_times(dcpl.get(), false), "disabling timestamps");
    H5Handle data = h5_dataset(
        H5Dcreate2(group.get(), f.name.c_str(), H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
        "creating " + what);
    if (!f.bytes.empty())
      h5check_status(H5Dwrite(data.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, f.bytes.data()),
                     "writing " + what);
  }
}

// The bytes of one file of the copy, its size checked before it is allocated.
std::string read_tokenizer_file(hid_t group, const std::string& name) {
  const std::string what = std::string("'") + kTokenizerFilesGroup + "/" + name + "'";
  if (!h5check_tri(H5Lexists(group, name.c_str(), H5P_DEFAULT), "looking up " + what))
    throw Hdf5Error("the tokenizer's copy lacks " + what);
  H5Handle data = h5_dataset(H5Dopen2(group, name.c_str(), H5P_DEFAULT), "opening " + what);
  H5Handle type = h5_type(H5Dget_type(data.get()), "type of " + what);
  H5Handle space = h5_space(H5Dget_space(data.get()), "dataspace of " + what);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1 ||
      H5Sget_simple_extent_ndims(space.get()) != 1)
    throw Hdf5Error(what + " is not a one-dimensional array of bytes");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  if (n > kMaxTokenizerFileBytes)
    throw Hdf5Error(what + " declares " + std::to_string(n) + " bytes, more than a tokenizer file may hold (" +
                    std::to_string(kMaxTokenizerFileBytes) + ")");
  std::string bytes(static_cast<size_t>(n), '\0');
  if (n > 0)
    h5check_status(H5Dread(data.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()),
                   "reading " + what);
  return bytes;
}

}  // namespace

// ---------------------------------------------------------------- writer

TokenDatasetWriter::TokenDatasetWriter(const std::string& path, uint64_t vocab_size, const std::string& tokenizer,
                                       uint32_t bos_id, uint32_t eos_id)
    : path_(path), tmp_path_(path + ".tmp"), vocab_size_(vocab_size), tokenizer_(tokenizer), bos_id_(bos_id),
      eos_id_(eos_id) {
  auto fail = [&](const std::string& what) { throw DatasetError("writing dataset '" + path_ + "': " + what); };
  if (vocab_size == 0 || vocab_size > static_cast<uint64_t>(INT32_MAX))
    fail("vocab_size " + std::to_string(vocab_size) + " must be in 1..2^31-1");
  if (bos_id >= vocab_size) fail("bos_id " + std::to_string(bos_id) + " >= vocab_size");
  if (eos_id >= vocab_size) fail("eos_id " + std::to_string(eos_id) + " >= vocab_size");
  fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty() && !fs::is_directory(parent)) fail("directory '" + parent.string() + "' does not exist");

  Hdf5Lock lock;
  try {
    // No object timestamps: the same documents give a byte-identical file.
    H5Handle fcpl = h5_plist(H5Pcreate(H5P_FILE_CREATE), "creating file properties");
    h5check_status(H5Pset_obj_track_times(fcpl.get(), false), "disabling timestamps");
    file_ = h5_file(H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT),
                    "creating '" + tmp_path_ + "'");
    hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {kTokenChunkElements};
    H5Handle space = h5_space(H5Screate_simple(1, dims, maxdims), "creating tokens dataspace");
    H5Handle dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE), "creating tokens properties");
    h5check_status(H5Pset_chunk(dcpl.get(), 1, chunk), "setting tokens chunking");
    h5check_status(H5Pset_obj_track_times(dcpl.get(), false), "disabling timestamps");
    h5check_status(H5Pset_shuffle(dcpl.get()), "setting shuffle filter");
    h5check_status(H5Pset_deflate(dcpl.get(), kDeflateLevel), "setting deflate filter");
    tokens_ = h5_dataset(H5Dcreate2(file_.get(), "tokens", H5T_STD_U32LE, space.get(), H5P_DEFAULT, dcpl.get(),
                                    H5P_DEFAULT),
                         "creating dataset 'tokens'");
  } catch (const Hdf5Error& e) {
    tokens_.reset();
    file_.reset();
    std::error_code ec;
    fs::remove(tmp_path_, ec);
    fail(e.what());
  }
  pending_.reserve(kWriterFlushElements);
}

TokenDatasetWriter::TokenDatasetWriter(TokenDatasetWriter&& o) noexcept
    : path_(std::move(o.path_)), tmp_path_(std::move(o.tmp_path_)), vocab_size_(o.vocab_size_),
      tokenizer_(std::move(o.tokenizer_)), tokenizer_copy_(std::move(o.tokenizer_copy_)), bos_id_(o.bos_id_), eos_id_(o.eos_id_), file_(std::move(o.file_)),
      tokens_(std::move(o.tokens_)), pending_(std::move(o.pending_)), offsets_(std::move(o.offsets_)),
      total_(o.total_), written_(o.written_), max_token_id_(o.max_token_id_), open_document_(o.open_document_),
      finished_(o.finished_) {
  o.finished_ = true;  // the moved-from writer owns nothing
}

TokenDatasetWriter::~TokenDatasetWriter() {
  if (!finished_) abandon();
}

void TokenDatasetWriter::abandon() noexcept {
  if (file_.valid() || tokens_.valid()) {
    Hdf5Lock lock;
    tokens_.reset();
    file_.reset();
  }
  std::error_code ec;
  if (!tmp_path_.empty()) fs::remove(tmp_path_, ec);
  finished_ = true;
}

void TokenDatasetWriter::append_partial(std::span<const uint32_t> tokens) {
  if (finished_) throw DatasetError("writing dataset '" + path_ + "': append after finish()");
  uint32_t max_id = max_token_id_;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size_)
      throw DatasetError("writing dataset '" + path_ + "': document " + std::to_string(num_documents()) +
                         ": token id " + std::to_string(tokens[i]) + " >= vocab_size " + std::to_string(vocab_size_));
    max_id = std::max(max_id, tokens[i]);
  }
  max_token_id_ = max_id;
  open_document_ = true;
  size_t i = 0;
  while (i < tokens.size()) {
    size_t take = std::min(tokens.size() - i, kWriterFlushElements - pending_.size());
    pending_.insert(pending_.end(), tokens.begin() + i, tokens.begin() + i + take);
    i += take;
    total_ += take;
    if (pending_.size() >= kWriterFlushElements) {
      Hdf5Lock lock;
      flush_pending();
    }
  }
}

void TokenDatasetWriter::store_tokenizer_copy(TokenizerFiles files) {
  if (files.identity != tokenizer_)
    throw DatasetError("writing dataset '" + path_ + "': the tokenizer's copy is of '" + files.identity +
                       "', the dataset's tokenizer is '" + tokenizer_ + "'");
  tokenizer_copy_ = std::move(files);
}

int64_t TokenDatasetWriter::end_document() {
  if (finished_) throw DatasetError("writing dataset '" + path_ + "': end_document after finish()");
  offsets_.push_back(total_);
  open_document_ = false;
  return num_documents() - 1;
}

int64_t TokenDatasetWriter::append(std::span<const uint32_t> tokens) {
  if (open_document_) throw DatasetError("writing dataset '" + path_ + "': append() inside a partial document");
  append_partial(tokens);
  return end_document();
}

void TokenDatasetWriter::flush_pending() {
  if (pending_.empty()) return;
  try {
    hsize_t new_size[1] = {written_ + pending_.size()};
    h5check_status(H5Dset_extent(tokens_.get(), new_size), "extending 'tokens'");
    H5Handle filespace = h5_space(H5Dget_space(tokens_.get()), "tokens dataspace");
    hsize_t start[1] = {written_}, count[1] = {pending_.size()};
    h5check_status(H5Sselect_hyperslab(filespace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
                   "selecting tokens");
    H5Handle memspace = h5_space(H5Screate_simple(1, count, nullptr), "memory dataspace");
    h5check_status(H5Dwrite(tokens_.get(), H5T_NATIVE_UINT32, memspace.get(), filespace.get(), H5P_DEFAULT,
                            pending_.data()),
                   "writing tokens");
  } catch (const Hdf5Error& e) {
    throw DatasetError("writing dataset '" + path_ + "': " + e.what());
  }
  written_ += pending_.size();
  pending_.clear();
}

void TokenDatasetWriter::finish() {
  if (finished_) throw DatasetError("writing dataset '" + path_ + "': finish() called twice");
  if (open_document_) end_document();
  try {
    Hdf5Lock lock;
    flush_pending();
    try {
      hsize_t n = offsets_.size();
      hsize_t dims[1] = {n}, chunk[1] = {std::min<hsize_t>(n, kTokenChunkElements)};
      H5Handle space = h5_space(H5Screate_simple(1, dims, nullptr), "creating doc_offsets dataspace");
      H5Handle dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE), "creating doc_offsets properties");
      h5check_status(H5Pset_chunk(dcpl.get(), 1, chunk), "setting doc_offsets chunking");
      h5check_status(H5Pset_obj_track_times(dcpl.get(), false), "disabling timestamps");
      h5check_status(H5Pset_shuffle(dcpl.get()), "setting shuffle filter");
      h5check_status(H5Pset_deflate(dcpl.get(), kDeflateLevel), "setting deflate filter");
      H5Handle offsets = h5_dataset(H5Dcreate2(file_.get(), "doc_offsets", H5T_STD_U64LE, space.get(), H5P_DEFAULT,
                                               dcpl.get(), H5P_DEFAULT),
                                    "creating dataset 'doc_offsets'");
      h5check_status(H5Dwrite(offsets.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()),
                     "writing doc_offsets");
      offsets.close("closing doc_offsets");
      hid_t f = file_.get();
      h5_write_attr_u32(f, "format_version", kDatasetFormatVersion);
      h5_write_attr_u64(f, "vocab_size", vocab_size_);
      h5_write_attr_string(f, "tokenizer", tokenizer_);
      h5_write_attr_u32(f, "bos_id", bos_id_);
      h5_write_attr_u32(f, "eos_id", eos_id_);
      h5_write_attr_u32(f, "max_token_id", max_token_id_);
      if (!tokenizer_copy_.files.empty()) write_tokenizer_copy(f, tokenizer_copy_);
      tokens_.close("closing tokens");
      file_.close("closing '" + tmp_path_ + "'");
    } catch (const Hdf5Error& e) {
      throw DatasetError("writing dataset '" + path_ + "': " + e.what());
    }
  } catch (...) {
    abandon();
    throw;
  }
  std::error_code ec;
  fs::rename(tmp_path_, path_, ec);
  if (ec) {
    abandon();
    throw DatasetError("writing dataset '" + path_ + "': renaming '" + tmp_path_ + "': " + ec.message());
  }
  finished_ = true;
}

// ---------------------------------------------------------------- reader

TokenDataset::TokenDataset(const std::string& path, DatasetFormat format) : path_(path) {
  auto fail = [&](const std::string& what) { throw DatasetError("dataset '" + path_ + "': " + what); };
  if (format == DatasetFormat::Megatron) {
    open_megatron();
    return;
  }
  std::error_code ec;
  fs::file_status st = fs::status(path_, ec);
  if (!fs::exists(st)) fail("file does not exist");
  if (fs::is_directory(st)) fail("is a directory, not an HDF5 file");

  Hdf5Lock lock;
  try {
    htri_t is_hdf5 = H5Fis_hdf5(path_.c_str());
    if (is_hdf5 < 0) fail("cannot be read: " + hdf5_error_stack_message());
    if (is_hdf5 == 0) fail("not an HDF5 file");

    H5Handle fapl = h5_plist(H5Pcreate(H5P_FILE_ACCESS), "file access properties");
    h5check_status(H5Pset_cache(fapl.get(), 0, kReaderChunkCacheSlots, kReaderChunkCacheBytes, 1.0),
                   "setting chunk cache");
    file_ = h5_file(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get()), "opening file");

    auto open_dataset = [&](const char* name, size_t elem_size, const char* expected) {
      if (!h5check_tri(H5Lexists(file_.get(), name, H5P_DEFAULT), std::string("looking up '") + name + "'"))
        fail(std::string("missing dataset '") + name + "'");
      H5Handle obj(h5check(H5Oopen(file_.get(), name, H5P_DEFAULT), std::string("opening '") + name + "'"),
                   H5Oclose);
      if (H5Iget_type(obj.get()) != H5I_DATASET) fail(std::string("'") + name + "' is not a dataset");
      H5Handle type = h5_type(H5Dget_type(obj.get()), std::string("type of '") + name + "'");
      if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != elem_size ||
          H5Tget_sign(type.get()) != H5T_SGN_NONE)
        fail(std::string("dataset '") + name + "' has type " + type_description(type.get()) + ", expected " +
             expected);
      H5Handle space = h5_space(H5Dget_space(obj.get()), std::string("dataspace of '") + name + "'");
      int rank = H5Sget_simple_extent_ndims(space.get());
      if (rank != 1)
        fail(std::string("dataset '") + name + "' has rank " + std::to_string(rank) + ", expected 1");
      hsize_t n = 0;
      H5Sget_simple_extent_dims(space.get(), &n, nullptr);
      // The extent is a number in the file's metadata: what the file holds bounds it
      // before anything is sized by it (doc_offsets is read whole).
      const double declared = static_cast<double>(n) * static_cast<double>(elem_size);
      const double stored = static_cast<double>(H5Dget_storage_size(obj.get()));
      if (declared > kMaxCompressionRatio * stored)
        fail(std::string("dataset '") + name + "' declares " + std::to_string(n) + " entries (" +
             std::to_string(static_cast<uint64_t>(declared)) + " bytes) but stores " +
             std::to_string(static_cast<uint64_t>(stored)) + " bytes, more than deflate's largest ratio of " +
             std::to_string(static_cast<int>(kMaxCompressionRatio)) + ":1 can expand: truncated or corrupt");
      return std::make_pair(std::move(obj), static_cast<uint64_t>(n));
    };

    auto [tokens, num_tokens] = open_dataset("tokens", 4, "uint32");
    auto [offsets, num_offsets] = open_dataset("doc_offsets", 8, "uint64");
    tokens_ = std::move(tokens);
    if (num_offsets == 0) fail("dataset 'doc_offsets' is empty (needs documents + 1 entries, the first 0)");
    offsets_.assign(num_offsets, 0);
    h5check_status(H5Dread(offsets.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()),
                   "reading doc_offsets");
    offsets.reset();
    if (offsets_[0] != 0) fail("doc_offsets[0] is " + std::to_string(offsets_[0]) + ", expected 0");
    for (size_t i = 1; i < offsets_.size(); ++i)
      if (offsets_[i] < offsets_[i - 1])
        fail("doc_offsets not monotone: doc_offsets[" + std::to_string(i) + "] = " + std::to_string(offsets_[i]) +
             " < doc_offsets[" + std::to_string(i - 1) + "] = " + std::to_string(offsets_[i - 1]));
    if (offsets_.back() != num_tokens)
      fail("doc_offsets ends at " + std::to_string(offsets_.back()) + " but 'tokens' holds " +
           std::to_string(num_tokens) + " tokens");

    hid_t f = file_.get();
    auto read_u32 = [&](const char* name) {
      uint64_t v = h5_read_attr_uint(f, name);
      if (v > UINT32_MAX) fail(std::string("attribute '") + name + "' = " + std::to_string(v) + " exceeds uint32");
      return static_cast<uint32_t>(v);
    };
    format_version_ = read_u32("format_version");
    if (format_version_ != kDatasetFormatVersion)
      fail("unsupported format_version " + std::to_string(format_version_) + " (this build reads " +
           std::to_string(kDatasetFormatVersion) + ")");
    vocab_size_ = h5_read_attr_uint(f, "vocab_size");
    if (vocab_size_ == 0 || vocab_size_ > static_cast<uint64_t>(INT32_MAX))
      fail("attribute 'vocab_size' = " + std::to_string(vocab_size_) + " is not in 1..2^31-1");
    tokenizer_ = h5_read_attr_string(f, "tokenizer");
    bos_id_ = read_u32("bos_id");
    eos_id_ = read_u32("eos_id");
    max_token_id_ = read_u32("max_token_id");
    auto check_id = [&](const char* name, uint32_t v) {
      if (v >= vocab_size_)
        fail(std::string("attribute '") + name + "' = " + std::to_string(v) + " is >= vocab_size " +
             std::to_string(vocab_size_));
    };
    check_id("bos_id", bos_id_);
    check_id("eos_id", eos_id_);
    check_id("max_token_id", max_token_id_);
  } catch (const Hdf5Error& e) {
    close();
    fail(e.what());
  } catch (...) {
    close();
    throw;
  }
}

// Megatron's .bin/.idx (data/megatron.h): the documents' token ranges from the index,
// the tokens memory-mapped. The files record no tokenizer, so the vocabulary is what
// the data holds (largest id + 1, found by one pass over the tokens).
struct MegatronSource {
  MegatronIndex index;
  std::unique_ptr<MegatronTokens> tokens;
};

void TokenDataset::open_megatron() {
  auto source = std::make_shared<MegatronSource>();
  source->index = read_megatron_index(path_);
  source->tokens = std::make_unique<MegatronTokens>(path_, source->index.dtype);
  const MegatronIndex& idx = source->index;
  std::vector<uint64_t> sequence_start(idx.sequence_lengths.size() + 1, 0);
  for (size_t s = 0; s < idx.sequence_lengths.size(); ++s)
    sequence_start[s + 1] = sequence_start[s] + static_cast<uint64_t>(idx.sequence_lengths[s]);
  offsets_.clear();
  for (int64_t d : idx.document_indices) offsets_.push_back(sequence_start[static_cast<size_t>(d)]);
  std::vector<int64_t> block(1 << 16);
  int64_t max_id = 0;
  for (uint64_t at = 0; at < source->tokens->size(); at += block.size()) {
    const uint64_t n = std::min<uint64_t>(block.size(), source->tokens->size() - at);
    source->tokens->read(at, n, block.data());
    for (uint64_t i = 0; i < n; ++i) {
      if (block[i] < 0 || block[i] > INT32_MAX)
        throw DatasetError("dataset '" + path_ + "': token " + std::to_string(at + i) + " of " + path_ +
                           ".bin is " + std::to_string(block[i]) + ", not a token id");
      max_id = std::max(max_id, block[i]);
    }
  }
  max_token_id_ = static_cast<uint32_t>(max_id);
  vocab_size_ = static_cast<uint64_t>(max_id) + 1;
  bos_id_ = eos_id_ = 0;  // not recorded by the format
  format_version_ = 1;  // MMIDIDX version 1
  // The tokenizer's identity from the copy prepare-data keeps beside the files.
  const std::string copy = megatron_tokenizer_directory(path_);
  std::error_code ec;
  tokenizer_ = kMegatronUnknownTokenizer;
  if (fs::is_directory(copy, ec)) {
    try {
      tokenizer_ = read_tokenizer_identity(copy);
    } catch (const TokenizerError& e) {
      throw DatasetError("dataset '" + path_ + "': " + e.what());
    }
  }
  megatron_ = std::move(source);
}

void TokenDataset::close() noexcept {
  // hdf5_mutex() held by the caller.
  tokens_.reset();
  file_.reset();
}

TokenDataset::TokenDataset(TokenDataset&& o) noexcept
    : path_(std::move(o.path_)), file_(std::move(o.file_)), tokens_(std::move(o.tokens_)),
      offsets_(std::move(o.offsets_)), vocab_size_(o.vocab_size_), bos_id_(o.bos_id_), eos_id_(o.eos_id_),
      max_token_id_(o.max_token_id_), format_version_(o.format_version_), tokenizer_(std::move(o.tokenizer_)),
      megatron_(std::move(o.megatron_)) {
  o.offsets_.assign(1, 0);
}

TokenDataset& TokenDataset::operator=(TokenDataset&& o) noexcept {
  if (this == &o) return *this;
  if (file_.valid() || tokens_.valid()) {
    Hdf5Lock lock;
    close();
  }
  path_ = std::move(o.path_);
  file_ = std::move(o.file_);
  tokens_ = std::move(o.tokens_);
  offsets_ = std::move(o.offsets_);
  o.offsets_.assign(1, 0);
  megatron_ = std::move(o.megatron_);
  vocab_size_ = o.vocab_size_;
  bos_id_ = o.bos_id_;
  eos_id_ = o.eos_id_;
  max_token_id_ = o.max_token_id_;
  format_version_ = o.format_version_;
  tokenizer_ = std::move(o.tokenizer_);
  return *this;
}

TokenDataset::~TokenDataset() {
  if (file_.valid() || tokens_.valid()) {
    Hdf5Lock lock;
    close();
  }
}

int64_t TokenDataset::document_length(int64_t document) const {
  if (document < 0 || document >= num_documents())
    throw std::out_of_range("dataset '" + path_ + "': document " + std::to_string(document) + " out of range (" +
                            std::to_string(num_documents()) + " documents)");
  return static_cast<int64_t>(offsets_[document + 1] - offsets_[document]);
}

void TokenDataset::read(int64_t document, int64_t offset, int64_t length, int32_t* out) const {
  int64_t doc_len = document_length(document);
  if (offset < 0 || length < 0 || offset + length > doc_len)
    throw std::out_of_range("dataset '" + path_ + "': document " + std::to_string(document) + ": tokens [" +
                            std::to_string(offset) + ", " + std::to_string(offset + length) +
                            ") outside its length " + std::to_string(doc_len));
  if (length == 0) return;
  if (megatron_) {
    std::vector<int64_t> ids(static_cast<size_t>(length));
    megatron_->tokens->read(offsets_[document] + static_cast<uint64_t>(offset), static_cast<uint64_t>(length), ids.data());
    for (int64_t i = 0; i < length; ++i) out[i] = static_cast<int32_t>(ids[i]);  // checked in range at open
    return;
  }
  if (!tokens_.valid()) throw DatasetError("dataset '" + path_ + "': read from a closed dataset");
  {
    Hdf5Lock lock;
    try {
      H5Handle filespace = h5_space(H5Dget_space(tokens_.get()), "tokens dataspace");
      hsize_t start[1] = {offsets_[document] + static_cast<uint64_t>(offset)};
      hsize_t count[1] = {static_cast<hsize_t>(length)};
      h5check_status(H5Sselect_hyperslab(filespace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
                     "selecting tokens");
      H5Handle memspace = h5_space(H5Screate_simple(1, count, nullptr), "memory dataspace");
      // Read as uint32 into the int32 buffer; ids are checked < vocab_size <= 2^31-1 below.
      h5check_status(H5Dread(tokens_.get(), H5T_NATIVE_UINT32, memspace.get(), filespace.get(), H5P_DEFAULT, out),
                     "reading tokens");
    } catch (const Hdf5Error& e) {
      throw DatasetError("dataset '" + path_ + "': document " + std::to_string(document) + ": " + e.what());
    }
  }
  for (int64_t i = 0; i < length; ++i) {
    uint32_t id = static_cast<uint32_t>(out[i]);
    if (id >= vocab_size_)
      throw DatasetError("dataset '" + path_ + "': document " + std::to_string(document) + ": token id " +
                         std::to_string(id) + " at offset " + std::to_string(offset + i) + " is >= vocab_size " +
                         std::to_string(vocab_size_));
  }
}

std::vector<int32_t> TokenDataset::read(const SequenceSpan& span) const {
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(span.length, 0)));
  read(span.document, span.offset, span.length, out.data());
  return out;
}

std::vector<int32_t> TokenDataset::read_document(int64_t document) const {
  return read(SequenceSpan{document, 0, document_length(document)});
}

std::string megatron_tokenizer_directory(const std::string& prefix) { return prefix + ".tokenizer"; }

std::optional<TokenizerFiles> dataset_tokenizer_copy(const std::string& path, DatasetFormat format) {
  try {
    if (format == DatasetFormat::Megatron) {
      const std::string dir = megatron_tokenizer_directory(path);
      std::error_code ec;
      if (!fs::is_directory(dir, ec)) return std::nullopt;
      return read_tokenizer_directory(dir);
    }
    Hdf5Lock lock;
    try {
      H5Handle file = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "opening file");
      const std::string identity = h5_read_attr_string(file.get(), "tokenizer");
      if (identity == kByteTokenizerName) return TokenizerFiles{identity, {}};
      if (!h5check_tri(H5Lexists(file.get(), kTokenizerFilesGroup, H5P_DEFAULT), "looking up the tokenizer's copy"))
        return std::nullopt;
      H5Handle group(h5check(H5Gopen2(file.get(), kTokenizerFilesGroup, H5P_DEFAULT), "opening the tokenizer's copy"),
                     H5Gclose);
      return read_tokenizer_copy(
          identity, [&](const std::string& name) { return read_tokenizer_file(group.get(), name); },
          path + " (group '" + kTokenizerFilesGroup + "')");
    } catch (const Hdf5Error& e) {
      throw DatasetError("dataset '" + path + "': " + e.what());
    }
  } catch (const TokenizerError& e) {
    throw DatasetError(std::string("dataset '") + path + "': " + e.what());
  }
}

}  // namespace hdp
