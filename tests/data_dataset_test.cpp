// TokenDatasetWriter / TokenDataset: round trip, validation errors, id checks.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/hdf5_lock.h"
#include "test_util.h"

namespace hdp {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<uint32_t>> sample_documents() {
  std::vector<std::vector<uint32_t>> docs;
  docs.push_back({1, 2, 3, 99});
  docs.push_back({});  // empty documents are allowed
  docs.push_back({42});
  std::vector<uint32_t> big;
  for (uint32_t i = 0; i < 200000; ++i) big.push_back((i * 7919u) % 100);  // spans several chunks
  docs.push_back(big);
  docs.push_back({0, 0, 7});
  return docs;
}

std::string write_sample(const std::string& dir, const std::vector<std::vector<uint32_t>>& docs) {
  std::string path = dir + "/sample.h5";
  TokenDatasetWriter w = TokenDatasetWriter::create(path, 100, "test-tok", 98, 99);
  for (const auto& d : docs) w.append(d);
  EXPECT_TRUE(fs::exists(path + ".tmp"));
  EXPECT_FALSE(fs::exists(path));
  w.finish();
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(fs::exists(path));
  return path;
}

// Low-level edits of a finished file, to build broken ones.
void overwrite_dataset_u64(const std::string& path, const char* name, const std::vector<uint64_t>& values) {
  Hdf5Lock lock;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Ldelete(f, name, H5P_DEFAULT);
  hsize_t n = values.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t d = H5Dcreate2(f, name, H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  H5Dclose(d);
  H5Sclose(space);
  H5Fclose(f);
}

void overwrite_tokens(const std::string& path, hid_t file_type, const std::vector<uint32_t>& values) {
  Hdf5Lock lock;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Ldelete(f, "tokens", H5P_DEFAULT);
  hsize_t n = values.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t d = H5Dcreate2(f, "tokens", file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  H5Dwrite(d, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  H5Dclose(d);
  H5Sclose(space);
  H5Fclose(f);
}

void delete_link(const std::string& path, const char* name, bool attribute) {
  Hdf5Lock lock;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  if (attribute)
    ASSERT_GE(H5Adelete(f, name), 0);
  else
    ASSERT_GE(H5Ldelete(f, name, H5P_DEFAULT), 0);
  H5Fclose(f);
}

void set_attr_u32(const std::string& path, const char* name, uint32_t value) {
  Hdf5Lock lock;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  h5_write_attr_u32(f, name, value);
  H5Fclose(f);
}

// Expects open() to throw DatasetError whose message names the file and contains `needle`.
void expect_open_error(const std::string& path, const std::string& needle) {
  try {
    TokenDataset ds(path);
    FAIL() << "no error opening " << path << " (expected: " << needle << ")";
  } catch (const DatasetError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(DataDataset, RoundTripTokensAndAttributes) {
  std::string dir = testing::scratch_dir("data_dataset_roundtrip");
  auto docs = sample_documents();
  std::string path = write_sample(dir, docs);

  TokenDataset ds = TokenDataset::open(path);
  EXPECT_EQ(ds.path(), path);
  EXPECT_EQ(ds.num_documents(), 5);
  EXPECT_EQ(ds.num_tokens(), 4 + 0 + 1 + 200000 + 3);
  EXPECT_EQ(ds.vocab_size(), 100u);
  EXPECT_EQ(ds.tokenizer(), "test-tok");
  EXPECT_EQ(ds.bos_id(), 98u);
  EXPECT_EQ(ds.eos_id(), 99u);
  EXPECT_EQ(ds.max_token_id(), 99u);
  EXPECT_EQ(ds.format_version(), 1u);
  std::vector<uint64_t> expected_offsets = {0, 4, 4, 5, 200005, 200008};
  EXPECT_EQ(ds.doc_offsets(), expected_offsets);
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_EQ(ds.document_length(d), static_cast<int64_t>(docs[d].size()));
    std::vector<int32_t> got = ds.read_document(d);
    std::vector<int32_t> want(docs[d].begin(), docs[d].end());
    EXPECT_EQ(got, want) << "document " << d;
  }
  // A hyperslab in the middle of the big document, across a chunk boundary.
  std::vector<int32_t> part(1000);
  ds.read(3, 65000, 1000, part.data());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(part[i], static_cast<int32_t>(docs[3][65000 + i])) << i;
  EXPECT_THROW(ds.read(3, 199999, 2, part.data()), std::out_of_range);
  EXPECT_THROW(ds.read(5, 0, 1, part.data()), std::out_of_range);
  EXPECT_THROW(ds.document_length(-1), std::out_of_range);

  // Moving keeps the dataset usable.
  TokenDataset moved = std::move(ds);
  EXPECT_EQ(moved.read_document(0), (std::vector<int32_t>{1, 2, 3, 99}));
}

TEST(DataDataset, StorageIsChunkedCompressedAndTyped) {
  std::string dir = testing::scratch_dir("data_dataset_layout");
  std::string path = write_sample(dir, sample_documents());
  Hdf5Lock lock;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  for (const char* name : {"tokens", "doc_offsets"}) {
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    ASSERT_GE(d, 0) << name;
    hid_t dcpl = H5Dget_create_plist(d);
    EXPECT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED) << name;
    int nfilters = H5Pget_nfilters(dcpl);
    bool deflate = false, shuffle = false;
    for (int i = 0; i < nfilters; ++i) {
      unsigned flags;
      size_t nelmts = 0;
      H5Z_filter_t id = H5Pget_filter2(dcpl, i, &flags, &nelmts, nullptr, 0, nullptr, nullptr);
      deflate |= id == H5Z_FILTER_DEFLATE;
      shuffle |= id == H5Z_FILTER_SHUFFLE;
    }
    EXPECT_TRUE(deflate && shuffle) << name;
    hid_t t = H5Dget_type(d);
    EXPECT_TRUE(H5Tequal(t, std::string(name) == "tokens" ? H5T_STD_U32LE : H5T_STD_U64LE) > 0) << name;
    H5Tclose(t);
    H5Pclose(dcpl);
    H5Dclose(d);
  }
  H5Fclose(f);
}

TEST(DataDataset, WriterRejectsBadIdsAndAbandonsTempFile) {
  std::string dir = testing::scratch_dir("data_dataset_writer");
  std::string path = dir + "/w.h5";
  {
    TokenDatasetWriter w(path, 10, "t", 8, 9);
    std::vector<uint32_t> bad = {1, 10};
    try {
      w.append(bad);
      FAIL() << "expected DatasetError";
    } catch (const DatasetError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("token id 10"), std::string::npos) << e.what();
    }
    std::vector<uint32_t> ok = {1, 2};
    w.append(ok);
    EXPECT_TRUE(fs::exists(path + ".tmp"));
  }  // destroyed without finish()
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THROW(TokenDatasetWriter(dir + "/no/such/dir/x.h5", 10, "t", 8, 9), DatasetError);
  EXPECT_THROW(TokenDatasetWriter(path, 10, "t", 10, 9), DatasetError);
}

TEST(DataDataset, StreamingAppendMatchesWholeAppend) {
  std::string dir = testing::scratch_dir("data_dataset_stream");
  std::string path = dir + "/s.h5";
  TokenDatasetWriter w(path, 300, "byte-level", 256, 257);
  std::vector<uint32_t> part1 = {5, 6}, part2 = {7};
  w.append_partial(part1);
  w.append_partial(part2);
  EXPECT_EQ(w.end_document(), 0);
  EXPECT_EQ(w.append(std::vector<uint32_t>{8}), 1);
  w.append_partial(std::vector<uint32_t>{9, 10});
  w.finish();  // ends the open document
  TokenDataset ds(path);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.read_document(0), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(ds.read_document(2), (std::vector<int32_t>{9, 10}));
  EXPECT_EQ(ds.max_token_id(), 10u);
}

TEST(DataDataset, MissingFileAndNotHdf5) {
  std::string dir = testing::scratch_dir("data_dataset_missing");
  expect_open_error(dir + "/nope.h5", "does not exist");
  std::string text = dir + "/text.h5";
  std::ofstream(text) << "this is not an HDF5 file\n";
  expect_open_error(text, "not an HDF5 file");
  expect_open_error(dir, "directory");
}

TEST(DataDataset, StructuralErrorsNameFileAndProblem) {
  std::string dir = testing::scratch_dir("data_dataset_broken");
  auto docs = sample_documents();

  std::string p1 = write_sample(dir, docs);
  fs::rename(p1, dir + "/no_tokens.h5");
  delete_link(dir + "/no_tokens.h5", "tokens", false);
  expect_open_error(dir + "/no_tokens.h5", "missing dataset 'tokens'");

  std::string p2 = write_sample(dir, docs);
  fs::rename(p2, dir + "/no_offsets.h5");
  delete_link(dir + "/no_offsets.h5", "doc_offsets", false);
  expect_open_error(dir + "/no_offsets.h5", "missing dataset 'doc_offsets'");

  std::string p3 = write_sample(dir, docs);
  fs::rename(p3, dir + "/not_monotone.h5");
  overwrite_dataset_u64(dir + "/not_monotone.h5", "doc_offsets", {0, 4, 3, 5, 200005, 200008});
  expect_open_error(dir + "/not_monotone.h5", "not monotone");

  std::string p4 = write_sample(dir, docs);
  fs::rename(p4, dir + "/short_offsets.h5");
  overwrite_dataset_u64(dir + "/short_offsets.h5", "doc_offsets", {0, 4, 4, 5, 200005});
  expect_open_error(dir + "/short_offsets.h5", "ends at 200005 but 'tokens' holds 200008");

  std::string p5 = write_sample(dir, docs);
  fs::rename(p5, dir + "/first_offset.h5");
  overwrite_dataset_u64(dir + "/first_offset.h5", "doc_offsets", {1, 4, 4, 5, 200005, 200008});
  expect_open_error(dir + "/first_offset.h5", "doc_offsets[0]");

  std::string p6 = write_sample(dir, docs);
  fs::rename(p6, dir + "/int_tokens.h5");
  std::vector<uint32_t> flat;
  for (auto& d : docs) flat.insert(flat.end(), d.begin(), d.end());
  overwrite_tokens(dir + "/int_tokens.h5", H5T_STD_I64LE, flat);
  expect_open_error(dir + "/int_tokens.h5", "has type int64, expected uint32");

  std::string p7 = write_sample(dir, docs);
  fs::rename(p7, dir + "/no_vocab.h5");
  delete_link(dir + "/no_vocab.h5", "vocab_size", true);
  expect_open_error(dir + "/no_vocab.h5", "attribute 'vocab_size' is missing");

  std::string p8 = write_sample(dir, docs);
  fs::rename(p8, dir + "/version.h5");
  set_attr_u32(dir + "/version.h5", "format_version", 7);
  expect_open_error(dir + "/version.h5", "unsupported format_version 7");

  std::string p9 = write_sample(dir, docs);
  fs::rename(p9, dir + "/maxid.h5");
  set_attr_u32(dir + "/maxid.h5", "max_token_id", 100);
  expect_open_error(dir + "/maxid.h5", "'max_token_id' = 100 is >= vocab_size 100");

  // 2-D tokens
  std::string p10 = write_sample(dir, docs);
  fs::rename(p10, dir + "/rank2.h5");
  {
    Hdf5Lock lock;
    hid_t f = H5Fopen((dir + "/rank2.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "tokens", H5P_DEFAULT);
    hsize_t dims[2] = {2, 100004};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(d);
    H5Sclose(space);
    H5Fclose(f);
  }
  expect_open_error(dir + "/rank2.h5", "has rank 2, expected 1");
}

// A small file whose doc_offsets declares 2^28 entries (2 GiB) but stores one
// chunk: refused from the sizes in its metadata, before anything is sized by the
// declared count (the reader once allocated 2.2 GB before rejecting such a file).
TEST(DataDataset, ADeclaredSizeBeyondWhatTheFileStoresIsRefusedBeforeAllocating) {
  const std::string dir = testing::scratch_dir("data_dataset_declared");
  const std::string path = write_sample(dir, sample_documents());
  {
    Hdf5Lock lock;
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    H5Ldelete(f, "doc_offsets", H5P_DEFAULT);
    hsize_t n = hsize_t{1} << 28, chunk = 65536;
    hid_t space = H5Screate_simple(1, &n, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, &chunk);
    H5Pset_deflate(dcpl, 4);
    hid_t d = H5Dcreate2(f, "doc_offsets", H5T_STD_U64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    const uint64_t first[2] = {0, 4};
    hsize_t start = 0, count = 2;
    hid_t file_space = H5Dget_space(d);
    H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
    hid_t memory_space = H5Screate_simple(1, &count, nullptr);
    H5Dwrite(d, H5T_NATIVE_UINT64, memory_space, file_space, H5P_DEFAULT, first);
    for (hid_t h : {memory_space, file_space, space}) H5Sclose(h);
    H5Pclose(dcpl);
    H5Dclose(d);
    H5Fclose(f);
  }
  EXPECT_LT(fs::file_size(path), 1u << 20);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  expect_open_error(path, "dataset 'doc_offsets' declares 268435456 entries (2147483648 bytes) but stores ");
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "kB of peak memory grown while opening";
}

TEST(DataDataset, ReadDetectsTokenIdOutsideVocabulary) {
  std::string dir = testing::scratch_dir("data_dataset_badid");
  auto docs = sample_documents();
  std::string path = write_sample(dir, docs);
  std::vector<uint32_t> flat;
  for (auto& d : docs) flat.insert(flat.end(), d.begin(), d.end());
  flat[200005 + 1] = 1000;  // document 4, offset 1
  overwrite_tokens(path, H5T_STD_U32LE, flat);
  TokenDataset ds(path);  // max_token_id attribute still claims 99
  EXPECT_EQ(ds.read_document(0), (std::vector<int32_t>{1, 2, 3, 99}));
  try {
    ds.read_document(4);
    FAIL() << "expected DatasetError";
  } catch (const DatasetError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("document 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("token id 1000"), std::string::npos) << msg;
  }
}

TEST(DataDataset, ConcurrentReadsFromTwoThreads) {
  std::string dir = testing::scratch_dir("data_dataset_threads");
  auto docs = sample_documents();
  std::string path = write_sample(dir, docs);
  TokenDataset ds(path);
  auto worker = [&](int seed, bool* ok) {
    *ok = true;
    std::vector<int32_t> buf(500);
    for (int i = 0; i < 300; ++i) {
      int64_t off = (i * 7919 + seed * 104729) % (200000 - 500);
      ds.read(3, off, 500, buf.data());
      for (int k = 0; k < 500; ++k)
        if (buf[k] != static_cast<int32_t>(docs[3][off + k])) *ok = false;
    }
  };
  bool ok1 = false, ok2 = false;
  std::thread t1(worker, 1, &ok1), t2(worker, 2, &ok2);
  t1.join();
  t2.join();
  EXPECT_TRUE(ok1);
  EXPECT_TRUE(ok2);
}

}  // namespace
}  // namespace hdp
