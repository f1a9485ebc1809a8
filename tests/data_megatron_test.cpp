// Megatron-LM's indexed dataset (data/megatron.h): what our writer makes is read
// back equal, the documented layout (docs/dataset-format.md) is checked field by
// field from the raw bytes, a file written by hand in another dtype and with
// several sequences per document reads as documented, and broken files are
// refused naming the file and the field.

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/megatron.h"
#include "data/prepare.h"
#include "test_util.h"

namespace hdp {
namespace {

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

template <class T>
T at(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

std::string open_error(const std::string& prefix) {
  try {
    TokenDataset d(prefix, DatasetFormat::Megatron);
  } catch (const DatasetError& e) {
    return e.what();
  }
  return "";
}

const std::vector<std::vector<uint32_t>> kDocuments = {{5, 6, 7}, {}, {65000, 1, 2, 3, 4}, {9}};

TEST(Megatron, WrittenFilesFollowTheDocumentedLayout) {
  const std::string dir = testing::scratch_dir("megatron-layout");
  const std::string prefix = dir + "/data";
  {
    MegatronWriter writer(prefix, 65001);  // below 65500: uint16
    EXPECT_EQ(writer.dtype(), MegatronDtype::U16);
    for (const auto& d : kDocuments) writer.append(d);
    writer.finish();
  }
  const std::string idx = bytes_of(prefix + ".idx"), bin = bytes_of(prefix + ".bin");
  // Header: magic, version 1, dtype code 8 (uint16), 4 sequences, 5 document indices.
  ASSERT_EQ(idx.size(), 34u + 4 * 4 + 8 * 4 + 8 * 5);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(at<uint64_t>(idx, 9), 1u);
  EXPECT_EQ(at<uint8_t>(idx, 17), 8u);
  EXPECT_EQ(at<uint64_t>(idx, 18), 4u);
  EXPECT_EQ(at<uint64_t>(idx, 26), 5u);
  // int32 lengths, int64 byte pointers, int64 document indices.
  const int32_t lengths[4] = {3, 0, 5, 1};
  const int64_t pointers[4] = {0, 6, 6, 16};
  const int64_t documents[5] = {0, 1, 2, 3, 4};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(at<int32_t>(idx, 34 + 4 * s), lengths[s]) << s;
    EXPECT_EQ(at<int64_t>(idx, 50 + 8 * s), pointers[s]) << s;
  }
  for (int d = 0; d < 5; ++d) EXPECT_EQ(at<int64_t>(idx, 82 + 8 * d), documents[d]) << d;
  // The .bin is the uint16 tokens back to back.
  ASSERT_EQ(bin.size(), 9u * 2);
  const uint16_t tokens[9] = {5, 6, 7, 65000, 1, 2, 3, 4, 9};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(at<uint16_t>(bin, 2 * i), tokens[i]) << i;

  // And read back equal, through the dataset the trainer uses.
  TokenDataset data(prefix, DatasetFormat::Megatron);
  ASSERT_EQ(data.num_documents(), 4);
  for (size_t d = 0; d < kDocuments.size(); ++d) {
    const std::vector<int32_t> want(kDocuments[d].begin(), kDocuments[d].end());
    EXPECT_EQ(data.read_document(static_cast<int64_t>(d)), want) << d;
  }
  EXPECT_EQ(data.vocab_size(), 65001u);  // largest id + 1: the format records no vocabulary
  EXPECT_EQ(data.max_token_id(), 65000u);
  EXPECT_EQ(data.read(SequenceSpan{2, 1, 3}), (std::vector<int32_t>{1, 2, 3}));
}

TEST(Megatron, LargeVocabulariesUseInt32) {
  const std::string dir = testing::scratch_dir("megatron-int32");
  {
    MegatronWriter writer(dir + "/d", 128256);
    EXPECT_EQ(writer.dtype(), MegatronDtype::I32);
    writer.append(std::vector<uint32_t>{128000, 7});
    writer.finish();
  }
  EXPECT_EQ(at<uint8_t>(bytes_of(dir + "/d.idx"), 17), 4u);
  EXPECT_EQ(TokenDataset(dir + "/d", DatasetFormat::Megatron).read_document(0), (std::vector<int32_t>{128000, 7}));
}

// An index written field by field: int64 tokens, two sequences in document 0.
void write_by_hand(const std::string& prefix, uint8_t code, const std::vector<int32_t>& lengths,
                   const std::vector<int64_t>& pointers, const std::vector<int64_t>& documents,
                   const std::vector<int64_t>& tokens, int64_t truncate_idx = 0) {
  std::string idx("MMIDIDX\0\0", 9);
  auto put = [&](const void* p, size_t n) { idx.append(static_cast<const char*>(p), n); };
  const uint64_t version = 1, s = lengths.size(), d = documents.size();
  put(&version, 8);
  put(&code, 1);
  put(&s, 8);
  put(&d, 8);
  put(lengths.data(), 4 * s);
  put(pointers.data(), 8 * s);
  put(documents.data(), 8 * d);
  idx.resize(idx.size() - static_cast<size_t>(truncate_idx));
  std::ofstream(prefix + ".idx", std::ios::binary) << idx;
  std::ofstream(prefix + ".bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(8 * tokens.size()));
}

TEST(Megatron, DocumentsOfSeveralSequences) {
  const std::string dir = testing::scratch_dir("megatron-by-hand");
  write_by_hand(dir + "/h", 5, {2, 1, 3}, {0, 16, 24}, {0, 2, 3}, {10, 11, 12, 20, 21, 22});
  TokenDataset data(dir + "/h", DatasetFormat::Megatron);
  ASSERT_EQ(data.num_documents(), 2);
  EXPECT_EQ(data.read_document(0), (std::vector<int32_t>{10, 11, 12}));  // sequences 0 and 1
  EXPECT_EQ(data.read_document(1), (std::vector<int32_t>{20, 21, 22}));
}

TEST(Megatron, BrokenFilesAreRefused) {
  const std::string dir = testing::scratch_dir("megatron-broken");
  const std::string p = dir + "/b";
  EXPECT_CONTAINS(open_error(p), p + ".idx does not exist");
  write_by_hand(p, 5, {2, 1}, {0, 16}, {0, 2}, {1, 2, 3}, /*truncate_idx=*/4);
  EXPECT_CONTAINS(open_error(p), "the file has");
  EXPECT_CONTAINS(open_error(p), "(truncated");
  write_by_hand(p, 6, {2}, {0}, {0, 1}, {1, 2});
  EXPECT_CONTAINS(open_error(p), p + ".idx: dtype code 6 is a float type");
  write_by_hand(p, 9, {2}, {0}, {0, 1}, {1, 2});
  EXPECT_CONTAINS(open_error(p), p + ".idx: unknown dtype code 9");
  write_by_hand(p, 5, {2, 1}, {0, 24}, {0, 2}, {1, 2, 3});
  EXPECT_CONTAINS(open_error(p), p + ".idx: sequence 1 starts at byte 24 of " + p + ".bin, expected 16");
  write_by_hand(p, 5, {2, 2}, {0, 16}, {0, 2}, {1, 2, 3});
  EXPECT_CONTAINS(open_error(p), p + ".bin has 24 bytes, the index describes 32");
  write_by_hand(p, 5, {2}, {0}, {0, 2}, {1, 2});
  EXPECT_CONTAINS(open_error(p), "document indices must start at 0 and end at the sequence count 1");
  write_by_hand(p, 5, {2}, {0}, {0, 1}, {1, -2});
  EXPECT_CONTAINS(open_error(p), "token 1 of " + p + ".bin is -2, not a token id");
  std::ofstream(p + ".idx") << "GARBAGE-GARBAGE-GARBAGE-GARBAGE-GARBAGE";
  EXPECT_CONTAINS(open_error(p), p + ".idx: not a Megatron index");
}

TEST(Megatron, PrepareDataWritesTheSameDocumentsAsHdf5) {
  const std::string dir = testing::scratch_dir("megatron-prepare");
  std::ofstream(dir + "/in.jsonl") << "{\"text\": \"hello\"}\n{\"text\": \"\"}\n{\"text\": \"world, again\"}\n";
  prepare_dataset({dir + "/in.jsonl"}, dir + "/h.h5");
  PrepareOptions options;
  options.format = DatasetFormat::Megatron;
  prepare_dataset({dir + "/in.jsonl"}, dir + "/m", options);
  TokenDataset h(dir + "/h.h5"), m(dir + "/m", DatasetFormat::Megatron);
  ASSERT_EQ(m.num_documents(), h.num_documents());
  for (int64_t d = 0; d < h.num_documents(); ++d) EXPECT_EQ(m.read_document(d), h.read_document(d)) << d;
}

}  // namespace
}  // namespace hdp
