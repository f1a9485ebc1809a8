// The safetensors reader and writer (checkpoint/safetensors.h): every dtype written
// by our writer reads back equal, and each kind of broken file (corrupted header,
// truncated data, overlapping or holed offsets, unknown or unsupported dtypes,
// shapes that disagree with their offsets) is refused with a CheckpointError
// naming the file and the tensor. The files are written byte by byte here, so
// each test controls exactly what is wrong.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "checkpoint/checkpoint_error.h"
#include "checkpoint/safetensors.h"

namespace hdp {
namespace {

// The file as the format lays it out: 8-byte little-endian header length, header, data.
void write_file(const std::string& path, const std::string& header, const std::vector<uint8_t>& data,
                int64_t length_override = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// The message of the CheckpointError that opening `path` throws ("" if none).
std::string open_error(const std::string& path) {
  try {
    SafetensorsReader reader(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(Safetensors, RoundTripsEveryDtype) {
  const std::string dir = testing::scratch_dir("safetensors-roundtrip");
  const std::string path = dir + "/model.safetensors";
  // Values each dtype holds exactly, including signed zero, a subnormal and infinity.
  const std::vector<float> f32 = {1.5f, -2.25f, 0.0f, -0.0f, 3.0e-39f, std::numeric_limits<float>::infinity(),
                                  1.0e30f, -7.0f};
  const std::vector<uint16_t> f16 = {0x3c00 /* 1 */, 0xc000 /* -2 */, 0x0001 /* 2^-24 */, 0x7bff /* 65504 */,
                                     0x8000 /* -0 */, 0x7c00 /* inf */};
  const std::vector<uint16_t> bf16 = {0x3f80 /* 1 */, 0xbfc0 /* -1.5 */, 0x0001 /* smallest subnormal */,
                                      0x7f7f /* largest finite */, 0xff80 /* -inf */, 0x4049 /* 3.140625 */};
  {
    SafetensorsWriter writer(path,
                             {{"a.f32", SafetensorsDtype::F32, {2, 4}},
                              {"b.f16", SafetensorsDtype::F16, {3, 2}},
                              {"c.bf16", SafetensorsDtype::BF16, {6}},
                              {"d.empty", SafetensorsDtype::F32, {0, 5}},
                              {"e.scalar", SafetensorsDtype::F32, {}}},
                             {{"format", "pt"}});
    writer.write_floats(f32);
    writer.write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(f16.data()), f16.size() * 2));
    writer.write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bf16.data()), bf16.size() * 2));
    writer.write_floats({});
    const float scalar = 42.0f;
    writer.write_floats(std::span<const float>(&scalar, 1));
    writer.finish();
  }
  ASSERT_FALSE(std::filesystem::exists(path + ".tmp"));
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  ASSERT_EQ(reader.tensors().size(), 5u);

  const SafetensorsTensor* a = reader.find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, SafetensorsDtype::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 4}));
  const std::vector<float> got_a = reader.read_floats(*a);
  ASSERT_EQ(got_a.size(), f32.size());
  EXPECT_EQ(std::memcmp(got_a.data(), f32.data(), f32.size() * 4), 0);  // bit for bit, -0 included

  const SafetensorsTensor* b = reader.find("b.f16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, SafetensorsDtype::F16);
  const std::vector<uint8_t> raw_b = reader.read_raw(*b);
  EXPECT_EQ(std::memcmp(raw_b.data(), f16.data(), raw_b.size()), 0);
  const std::vector<float> got_b = reader.read_floats(*b);
  const std::vector<float> want_b = {1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f, -0.0f,
                                     std::numeric_limits<float>::infinity()};
  EXPECT_EQ(std::memcmp(got_b.data(), want_b.data(), want_b.size() * 4), 0);

  const SafetensorsTensor* c = reader.find("c.bf16");
  ASSERT_NE(c, nullptr);
  const std::vector<float> got_c = reader.read_floats(*c);
  EXPECT_EQ(got_c[0], 1.0f);
  EXPECT_EQ(got_c[1], -1.5f);
  EXPECT_EQ(got_c[2], std::ldexp(1.0f, -133));
  EXPECT_EQ(got_c[3], 3.38953139e38f);
  EXPECT_EQ(got_c[4], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(got_c[5], 3.140625f);

  EXPECT_EQ(reader.read_floats(*reader.find("d.empty")).size(), 0u);
  EXPECT_EQ(reader.read_floats(*reader.find("e.scalar")), std::vector<float>{42.0f});

  // The header starts the data at an 8-byte boundary, as the reference writer does.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, NarrowingRoundsToNearestEven) {
  // (bf16 rounds in kernels/dtype.h, tested in kernels_bf16_test.)
  // f16: every one of the 63488 finite halves survives a round trip through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff)) continue;  // NaN payloads
    ASSERT_EQ(float_to_f16(f16_to_float(bits)), bits) << std::hex << h;
  }
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // past the largest half rounds to infinity
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

class BrokenFile : public ::testing::Test {
 protected:
  // One directory per test: ctest may run the fixture's tests at once.
  void SetUp() override {
    dir_ = testing::scratch_dir(std::string("safetensors-broken-") +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::string file(const std::string& header, const std::vector<uint8_t>& data, int64_t length = -1) {
    const std::string path = dir_ + "/" + std::to_string(count_++) + ".safetensors";
    write_file(path, header, data, length);
    return path;
  }
  std::string dir_;
  int count_ = 0;
};

TEST_F(BrokenFile, TooShortForTheHeaderLength) {
  const std::string path = dir_ + "/short.safetensors";
  std::ofstream(path) << "abc";
  const std::string e = open_error(path);
  EXPECT_CONTAINS(e, path + ": the file is 3 bytes, shorter than the 8-byte header length");
}

TEST_F(BrokenFile, HeaderLengthPastTheEnd) {
  const std::string path = file("{}", {}, 500);
  EXPECT_CONTAINS(open_error(path), path + ": header length 500 runs past the end of the file (10 bytes): truncated");
}

TEST_F(BrokenFile, HeaderLengthAboveTheLimit) {
  const std::string path = file("{}", {}, int64_t{1} << 40);
  EXPECT_CONTAINS(open_error(path), "above the format's limit of 100 MB");
}

TEST_F(BrokenFile, CorruptedJson) {
  const std::string path = file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", {0, 0, 0, 0});
  EXPECT_CONTAINS(open_error(path), path + ": the header is not valid JSON");
}

TEST_F(BrokenFile, TruncatedData) {
  const std::string path =
      file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
           R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
           std::vector<uint8_t>(20));
  EXPECT_CONTAINS(open_error(path), path + ": tensor 'b': data_offsets end at byte 24 of the data, but the file "
                                           "holds 20 bytes of data: truncated");
}

TEST_F(BrokenFile, OverlappingTensors) {
  const std::string path =
      file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
           R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
           std::vector<uint8_t>(12));
  EXPECT_CONTAINS(open_error(path), path + ": tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]");
}

TEST_F(BrokenFile, HoleInTheData) {
  const std::string path =
      file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
           R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
           std::vector<uint8_t>(12));
  EXPECT_CONTAINS(open_error(path), path + ": tensor 'b': data_offsets begin at 8, leaving bytes [4, 8)");
}

TEST_F(BrokenFile, TrailingBytes) {
  const std::string path =
      file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", std::vector<uint8_t>(9));
  EXPECT_CONTAINS(open_error(path), path + ": 5 bytes after the last tensor's data");
}

TEST_F(BrokenFile, ShapeDisagreesWithOffsets) {
  const std::string path =
      file(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})", std::vector<uint8_t>(8));
  EXPECT_CONTAINS(open_error(path),
                  path + ": tensor 'w': shape [2, 3] of BF16 needs 12 bytes, data_offsets [0, 8] hold 8");
}

TEST_F(BrokenFile, UnknownDtype) {
  const std::string path =
      file(R"({"w": {"dtype": "FP32", "shape": [1], "data_offsets": [0, 4]}})", std::vector<uint8_t>(4));
  EXPECT_CONTAINS(open_error(path), path + ": tensor 'w': unknown dtype 'FP32'");
}

TEST_F(BrokenFile, UnsupportedDtype) {
  const std::string path =
      file(R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", std::vector<uint8_t>(8));
  EXPECT_CONTAINS(open_error(path), path + ": tensor 'w': dtype I64 is not supported; this reader takes F32, F16 and BF16");
}

TEST_F(BrokenFile, MistypedFields) {
  EXPECT_CONTAINS(open_error(file(R"({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", std::vector<uint8_t>(4))),
                  "tensor 'w': dtype must be a string, got 7");
  EXPECT_CONTAINS(open_error(file(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", std::vector<uint8_t>(4))),
                  "tensor 'w': every dimension of shape must be a non-negative integer, got -1");
  EXPECT_CONTAINS(open_error(file(R"({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})", std::vector<uint8_t>(4))),
                  "tensor 'w': shape must be an array of integers");
  EXPECT_CONTAINS(open_error(file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", std::vector<uint8_t>(4))),
                  "tensor 'w': data_offsets must be [begin, end]");
  EXPECT_CONTAINS(open_error(file(R"({"w": {"dtype": "F32", "shape": [1]}})", std::vector<uint8_t>(4))),
                  "tensor 'w': 'data_offsets' is missing");
  EXPECT_CONTAINS(open_error(file(R"({"w": [1, 2]})", {})), "tensor 'w': expected an object");
  EXPECT_CONTAINS(open_error(file(R"({"__metadata__": {"format": 1}})", {})), "__metadata__ 'format' must be a string");
  EXPECT_CONTAINS(open_error(file(R"([1, 2])", {})), "the header must be a JSON object, got array");
}

TEST_F(BrokenFile, DuplicateName) {
  const std::string path =
      file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
           R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
           std::vector<uint8_t>(8));
  EXPECT_CONTAINS(open_error(path), path + ": tensor 'w': named twice in the header");
}

TEST(SafetensorsWriter, RefusesWrongSizesAndMissingTensors) {
  const std::string dir = testing::scratch_dir("safetensors-writer");
  const std::string path = dir + "/out.safetensors";
  {
    SafetensorsWriter writer(path, {{"a", SafetensorsDtype::F32, {2}}, {"b", SafetensorsDtype::BF16, {2}}});
    const float three[3] = {1, 2, 3};
    try {
      writer.write_floats(three);
      FAIL() << "a wrong size was accepted";
    } catch (const CheckpointError& e) {
      EXPECT_CONTAINS(e.what(), path + ": tensor 'a': got 12 bytes, its shape and dtype need 8");
    }
    const float two[2] = {1, 2};
    writer.write_floats(two);
    try {
      writer.finish();
      FAIL() << "a missing tensor was accepted";
    } catch (const CheckpointError& e) {
      EXPECT_CONTAINS(e.what(), path + ": tensor 'b': declared but never written");
    }
  }
  // An unfinished writer leaves nothing behind.
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace hdp
